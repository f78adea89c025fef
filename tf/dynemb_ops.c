/*
 * dynemb_ops.c -- TensorFlow op library for dynemb, written in C against
 * TensorFlow's C op/kernel API (tensorflow/c/ops.h, tensorflow/c/kernels.h).
 *
 * This is the library's only translation unit that includes TensorFlow
 * headers (through tf/kernel_util.h, which says why there can be only one).
 * The engine (build/libdynemb.a, -fPIC, hidden visibility except the public
 * DYNEMB_API functions) is linked in statically, so the same loaded .so also
 * exports dynemb_* for Python's ctypes (tables are created at graph
 * construction time from Python, then found by name from the kernels).
 *
 * Ops (all CPU, all stateful so TF never prunes, merges or constant-folds
 * them; tables are found by name in the engine's process registry on every
 * call, because the kernel instance is per (session, node) and a table may
 * be dropped and re-created between sessions):
 *   DynembLookup  ids(int32|int64, any shape), now(int64 scalar),
 *                 anchor(float, ignored), tickets(int64 [n], used only when
 *                 attr use_tickets is set by a graph rewrite: the admission
 *                 tickets of the prepared batch, dynemb_lookup_prepared)
 *                 -> float [n, dim], and has_row bool ([n] with attr
 *                 `found`, else [0]): which ids read a row (the others the
 *                 default: not admitted, unknown), dynemb_lookup's tickets
 *   DynembPrepare ids, now -> tickets int64 (ids' shape; -1 =
 *                 DYNEMB_NOT_ADMITTED): dynemb_prepare
 *   (Both: attr faae_coefficient, the sightings one occurrence counts for
 *   admission: dynemb_lookup_opts.weight.)
 *   DynembApply   keys int64 [n], grads float [n, dim], learning_rate float
 *                 scalar, trainable int64 [m] (any order; used only when
 *                 attr use_trainable is set by a graph rewrite: the keys
 *                 whose gradients may be applied: a filtered dynemb_apply),
 *                 tickets int64 [n] (used only when attr use_tickets is
 *                 set: one admission ticket per key, dynemb_apply_opts.tickets)
 *                 -> applied int64 scalar
 *   DynembEvict   now int64 scalar -> evicted int64 scalar (attr threshold:
 *                 -1, the table's; >= 0, that one: dynemb_evict's threshold)
 *   DynembExport  -> meta int64[3] (dim, row_floats, optimizer kind), keys,
 *                 values [rows, row_floats], last_access, cand_keys,
 *                 cand_counts, cand_last_access, apply_steps (scalar)
 *   DynembImport  the same eight tensors -> size int64 scalar (rows after)
 *   DynembLoadCheckpoint stamp int64 scalar (-1: keep the saved times) ->
 *                 size int64 scalar: dynemb_checkpoint_load of table
 *                 attr source_name from engine checkpoint attr dir (warm
 *                 start of tables with an SSD tier)
 *   DynembStats   -> int64 [20] (dynemb_table_stats, in field order)
 *   DynembSetAccessThreshold threshold int64 scalar (0 .. 2^32-1) ->
 *                 previous int64 scalar: dynemb_table_set_access_threshold
 *                 and counting resumed, or for 0 the counting of sightings
 *                 stopped (mxRec's set_threshold as an op the script runs)
 *
 * Facts about TF 2.15.1's C API verified while writing this file:
 *  - tf.load_op_library calls no init symbol: registration runs from an
 *    __attribute__((constructor)) function below.
 *  - Shape functions are set to "unknown shape" in C
 *    (TF_ShapeInferenceContextSetUnknownShape sets every output); Python
 *    calls set_shape with what it knows (ops.h cannot read int/string attrs
 *    in shape functions).
 *  - TF_OpDefinitionBuilderSetIsStateful(b, true) yields op_def.is_stateful
 *    (checked from Python in tests/py/test_bridge.py). Reportedly the bool
 *    argument is ignored by some versions, so only true is ever passed.
 *  - TF_OpKernelConstruction_GetAttrString memcpy's min(len, max_length)
 *    bytes and does not NUL-terminate (tensorflow/c/kernels.cc): the length
 *    comes from TF_OpKernelConstruction_GetAttrSize (total_size) and the
 *    buffer is calloc'ed one byte longer.
 *  - TF_ShapeInferenceContextSetUnknownShape sets every output (ops.h), so
 *    one shape function serves every op.
 *  - A kernel registered without TF_KernelBuilder_TypeConstraint serves
 *    every type the op's type attr allows (int32 and int64 ids here).
 *  - ops.h is C++-only as shipped: it declares `struct TF_ShapeHandle;` etc.
 *    without typedefs and then uses the bare type names; C needs the
 *    typedefs below before including it.
 *  - TF_GetInput and TF_AllocateOutput return TF_Tensor wrappers the caller
 *    must TF_DeleteTensor (the buffers stay owned by TF).
 *  - TF_InputRange maps an input's name to its index range (one index for
 *    a non-list input); kernels look their inputs up by name with it, so
 *    an op definition can gain inputs without kernels reading the wrong
 *    one.
 */
#include "kernel_util.h"

/* Largest ids rank DynembPrepare accepts (its output has the ids' shape). */
#define DYNEMB_PREPARE_MAX_RANK 16

/* Per-kernel state: the table name attr (and is_train and the sighting
 * weight, faae_coefficient, for lookups and prepares). */
typedef struct kstate {
  char *table_name;
  int is_train;
  int64_t weight;
  int use_trainable; /* apply: use input `trainable` (set by graph rewrites) */
  int use_tickets;   /* lookup, apply: use input `tickets` (graph rewrites) */
  int found;         /* lookup: output has_row says which ids read a row */
  int64_t threshold; /* evict: >= 0, or -1: the table's own */
  int64_t shard_index, shard_count, flags; /* import, load only */
  char *dir, *source_name; /* load only: checkpoint directory, table in it */
  int rows_only;           /* load only */
} kstate;

/* `bool_attr`: "is_train" (lookup, prepare) or NULL. */
static void delete_state(void *p);

static void *create_common(TF_OpKernelConstruction *c, const char *bool_attr,
                           int import) {
  TF_Status *st = TF_NewStatus();
  kstate *k = calloc(1, sizeof *k);
  if (!k) {
    TF_SetStatus(st, TF_RESOURCE_EXHAUSTED, "dynemb: out of memory");
    goto fail;
  }
  k->table_name = get_string_attr(c, "table_name", st);
  if (!k->table_name) goto fail;
  if (bool_attr) {
    TF_Bool b = 1;
    TF_OpKernelConstruction_GetAttrBool(c, bool_attr, &b, st);
    if (TF_GetCode(st) != TF_OK) goto fail;
    k->is_train = b ? 1 : 0;
    TF_OpKernelConstruction_GetAttrInt64(c, "faae_coefficient", &k->weight,
                                         st);
    if (TF_GetCode(st) != TF_OK) goto fail;
    if (k->weight < 1 || k->weight > INT32_MAX) {
      TF_SetStatus(st, TF_INVALID_ARGUMENT,
                   "dynemb: faae_coefficient must be 1 .. 2^31-1");
      goto fail;
    }
  }
  if (import) {
    TF_OpKernelConstruction_GetAttrInt64(c, "shard_index", &k->shard_index, st);
    if (TF_GetCode(st) != TF_OK) goto fail;
    TF_OpKernelConstruction_GetAttrInt64(c, "shard_count", &k->shard_count, st);
    if (TF_GetCode(st) != TF_OK) goto fail;
    TF_OpKernelConstruction_GetAttrInt64(c, "flags", &k->flags, st);
    if (TF_GetCode(st) != TF_OK) goto fail;
  }
  TF_DeleteStatus(st);
  return k;
fail:
  TF_OpKernelConstruction_Failure(c, st);
  TF_DeleteStatus(st);
  if (k) free(k->table_name);
  free(k);
  return NULL;
}

static void *create_plain(TF_OpKernelConstruction *c) {
  return create_common(c, NULL, 0);
}
static void *create_lookup(TF_OpKernelConstruction *c) {
  return create_common(c, "is_train", 0);
}
/* `k`, or NULL after failing the construction when `st` (freed here) says
 * an attr could not be read. */
static kstate *checked(TF_OpKernelConstruction *c, kstate *k, TF_Status *st) {
  if (TF_GetCode(st) != TF_OK) {
    TF_OpKernelConstruction_Failure(c, st);
    delete_state(k);
    k = NULL;
  }
  TF_DeleteStatus(st);
  return k;
}

/* create_common plus more bool attrs (names[i] into *outs[i]); NULL and a
 * failed construction if one cannot be read. */
static kstate *with_bools(TF_OpKernelConstruction *c, kstate *k,
                          const char *const *names, int *const *outs) {
  if (!k) return NULL;
  TF_Status *st = TF_NewStatus();
  for (int i = 0; names[i] && TF_GetCode(st) == TF_OK; i++) {
    TF_Bool b = 0;
    TF_OpKernelConstruction_GetAttrBool(c, names[i], &b, st);
    *outs[i] = b ? 1 : 0;
  }
  return checked(c, k, st);
}

/* DynembLookup: is_train, use_tickets and found. */
static void *create_lookup_prepared(TF_OpKernelConstruction *c) {
  kstate *k = create_common(c, "is_train", 0);
  return with_bools(c, k, (const char *const[]){"use_tickets", "found", NULL},
                    k ? (int *const[]){&k->use_tickets, &k->found} : NULL);
}

/* DynembApply: use_trainable and use_tickets. */
static void *create_apply(TF_OpKernelConstruction *c) {
  kstate *k = create_common(c, NULL, 0);
  return with_bools(c, k,
                    (const char *const[]){"use_trainable", "use_tickets", NULL},
                    k ? (int *const[]){&k->use_trainable, &k->use_tickets}
                      : NULL);
}
/* DynembEvict: the threshold attr. */
static void *create_evict(TF_OpKernelConstruction *c) {
  kstate *k = create_common(c, NULL, 0);
  if (!k) return NULL;
  TF_Status *st = TF_NewStatus();
  TF_OpKernelConstruction_GetAttrInt64(c, "threshold", &k->threshold, st);
  return checked(c, k, st);
}

static void *create_import(TF_OpKernelConstruction *c) {
  return create_common(c, NULL, 1);
}

/* DynembLoadCheckpoint: the import attrs, the checkpoint's directory and
 * table name, and rows_only. */
static void *create_load(TF_OpKernelConstruction *c) {
  kstate *k = create_common(c, NULL, 1);
  if (!k) return NULL;
  TF_Status *st = TF_NewStatus();
  k->dir = get_string_attr(c, "dir", st);
  if (k->dir) k->source_name = get_string_attr(c, "source_name", st);
  if (!k->source_name) { /* (st says why) */
    TF_OpKernelConstruction_Failure(c, st);
    delete_state(k);
    k = NULL;
  }
  TF_DeleteStatus(st);
  return with_bools(c, k, (const char *const[]){"rows_only", NULL},
                    k ? (int *const[]){&k->rows_only} : NULL);
}

static void delete_state(void *p) {
  kstate *k = p;
  if (k) {
    free(k->table_name);
    free(k->dir);
    free(k->source_name);
  }
  free(k);
}

/* Finds the kernel's table; on failure fails the kernel and returns NULL. */
static dynemb_table *find_table(TF_OpKernelContext *ctx, const kstate *k,
                                const char *op) {
  dynemb_table *t = NULL;
  int rc = dynemb_table_find(k->table_name, &t);
  if (rc != DYNEMB_OK) {
    const char *m = dynemb_last_error();
    fail(ctx, code_of(rc),
         "dynemb %s: table '%s' is not registered in this process (%s). "
         "Create it with dynemb.create_table(name='%s', ...) before running "
         "the graph, in the same process.",
         op, k->table_name, (m && *m) ? m : dynemb_strerror(rc),
         k->table_name);
    return NULL;
  }
  return t;
}

/* ------------------------------------------------------------------------ */
/* DynembLookup                                                              */
/* ------------------------------------------------------------------------ */

static void lookup_compute(void *p, TF_OpKernelContext *ctx) {
  const kstate *k = p;
  TF_Tensor *ids = NULL, *nowt = NULL, *out = NULL, *tickets = NULL;
  TF_Tensor *has = NULL;
  dynemb_table *t = NULL;
  int64_t *wide = NULL;
  dynemb_ticket *own = NULL;
  if (!(ids = input(ctx, "ids")) || !(nowt = input(ctx, "now")) ||
      !(tickets = input(ctx, "tickets")))
    goto done;
  int64_t now = 0;
  if (scalar_i64(ctx, nowt, "lookup", "now", &now)) goto done;
  if (!(t = find_table(ctx, k, "lookup"))) goto done;
  const int64_t n = TF_TensorElementCount(ids);
  const int dim = dynemb_table_dim(t);
  const int64_t dims[2] = {n, dim}, hdims[1] = {k->found ? n : 0};
  if (!(out = output(ctx, 0, TF_FLOAT, dims, 2, sizeof(float))) ||
      !(has = output(ctx, 1, TF_BOOL, hdims, 1, sizeof(TF_Bool))))
    goto done;
  if (n == 0) goto done;
  const int64_t *keys =
      ids_as_int64(ctx, k->table_name, ids, n, "lookup", &wide);
  if (!keys) goto done;
  int rc;
  const dynemb_ticket *which = NULL; /* found: the tickets saying it */
  if (k->use_tickets) {
    if (TF_TensorElementCount(tickets) != n) {
      fail(ctx, TF_INVALID_ARGUMENT, "dynemb lookup: table '%s': %lld "
           "admission tickets for %lld ids", k->table_name,
           (long long)TF_TensorElementCount(tickets), (long long)n);
      goto done;
    }
    /* int64 -1 is DYNEMB_NOT_ADMITTED (UINT64_MAX): same bits */
    rc = dynemb_lookup_prepared(
        t, keys, TF_TensorData(tickets), (size_t)n, TF_TensorData(out),
        k->found ? (unsigned char *)TF_TensorData(has) : NULL);
  } else {
    if (k->found && !(own = malloc((size_t)n * sizeof *own))) {
      fail(ctx, TF_RESOURCE_EXHAUSTED, "dynemb lookup: out of memory");
      goto done;
    }
    which = own; /* (NULL unless found: the engine then writes no tickets) */
    const dynemb_lookup_opts o = {.weight = (uint32_t)k->weight};
    rc = dynemb_lookup(t, keys, (size_t)n,
                       k->is_train ? DYNEMB_LOOKUP_TRAIN : DYNEMB_LOOKUP_EVAL,
                       now, &o, TF_TensorData(out), own);
  }
  if (rc != DYNEMB_OK) {
    fail_engine(ctx, rc, "lookup");
  } else if (which) { /* (the prepared read wrote has_row itself) */
    TF_Bool *h = TF_TensorData(has);
    for (int64_t i = 0; i < n; i++) h[i] = which[i] != DYNEMB_NOT_ADMITTED;
  }
done:
  free(wide);
  free(own);
  if (has) TF_DeleteTensor(has);
  if (tickets) TF_DeleteTensor(tickets);
  if (out) TF_DeleteTensor(out);
  if (ids) TF_DeleteTensor(ids);
  if (nowt) TF_DeleteTensor(nowt);
  dynemb_table_release(t);
}

/* ------------------------------------------------------------------------ */
/* DynembPrepare                                                             */
/* ------------------------------------------------------------------------ */

/* The table-side work of a lookup (is_train: count, insert, stamp) ahead of
 * the step, without values: one admission ticket per id. */
static void prepare_compute(void *p, TF_OpKernelContext *ctx) {
  const kstate *k = p;
  TF_Tensor *ids = NULL, *nowt = NULL, *out = NULL;
  dynemb_table *t = NULL;
  int64_t *wide = NULL;
  if (!(ids = input(ctx, "ids")) || !(nowt = input(ctx, "now"))) goto done;
  int64_t now = 0;
  if (scalar_i64(ctx, nowt, "prepare", "now", &now)) goto done;
  if (!(t = find_table(ctx, k, "prepare"))) goto done;
  const int nd = TF_NumDims(ids);
  int64_t dims[DYNEMB_PREPARE_MAX_RANK];
  if (nd > DYNEMB_PREPARE_MAX_RANK) {
    fail(ctx, TF_INVALID_ARGUMENT, "dynemb prepare: table '%s': ids have rank "
         "%d; at most %d is supported", k->table_name, nd,
         DYNEMB_PREPARE_MAX_RANK);
    goto done;
  }
  for (int d = 0; d < nd; d++) dims[d] = TF_Dim(ids, d);
  if (!(out = output(ctx, 0, TF_INT64, dims, nd, sizeof(int64_t)))) goto done;
  const int64_t n = TF_TensorElementCount(ids);
  if (n == 0) goto done;
  const int64_t *keys =
      ids_as_int64(ctx, k->table_name, ids, n, "prepare", &wide);
  if (!keys) goto done;
  const int mode = k->is_train ? DYNEMB_LOOKUP_TRAIN : DYNEMB_LOOKUP_EVAL;
  int rc = dynemb_prepare(t, keys, (size_t)n, mode, now,
                          &(dynemb_lookup_opts){.weight = (uint32_t)k->weight},
                          TF_TensorData(out));
  if (rc != DYNEMB_OK) fail_engine(ctx, rc, "prepare");
done:
  free(wide);
  if (out) TF_DeleteTensor(out);
  if (ids) TF_DeleteTensor(ids);
  if (nowt) TF_DeleteTensor(nowt);
  dynemb_table_release(t);
}

/* ------------------------------------------------------------------------ */
/* DynembApply                                                               */
/* ------------------------------------------------------------------------ */

static void apply_compute(void *p, TF_OpKernelContext *ctx) {
  const kstate *k = p;
  TF_Tensor *keys = NULL, *grads = NULL, *lrt = NULL, *trainable = NULL,
            *tickets = NULL;
  dynemb_table *t = NULL;
  if (!(keys = input(ctx, "keys")) || !(grads = input(ctx, "grads")) ||
      !(lrt = input(ctx, "learning_rate")) ||
      !(trainable = input(ctx, "trainable")) ||
      !(tickets = input(ctx, "tickets")))
    goto done;
  if (!(t = find_table(ctx, k, "apply"))) goto done;
  const int dim = dynemb_table_dim(t);
  const int64_t n = TF_TensorElementCount(keys);
  if (TF_TensorElementCount(grads) != n * dim) {
    fail(ctx, TF_INVALID_ARGUMENT, "dynemb apply: table '%s' (dim %d): got "
         "%lld gradient values for %lld keys; expected keys*dim = %lld",
         k->table_name, dim, (long long)TF_TensorElementCount(grads),
         (long long)n, (long long)(n * dim));
    goto done;
  }
  if (TF_TensorElementCount(lrt) != 1) {
    fail(ctx, TF_INVALID_ARGUMENT, "dynemb apply: table '%s': learning_rate "
         "must be a float scalar", k->table_name);
    goto done;
  }
  const float lr = *(const float *)TF_TensorData(lrt);
  if (k->use_tickets && TF_TensorElementCount(tickets) != n) {
    fail(ctx, TF_INVALID_ARGUMENT, "dynemb apply: table '%s': got %lld "
         "admission tickets for %lld keys; the graph rewrite must pass one "
         "ticket per key (rebuild the graph with the same dynemb version)",
         k->table_name, (long long)TF_TensorElementCount(tickets),
         (long long)n);
    goto done;
  }
  dynemb_apply_stats s = {0};
  dynemb_apply_opts o = {0};
  if (k->use_tickets) o.tickets = TF_TensorData(tickets);
  if (k->use_trainable) {
    o.filtered = 1;
    o.trainable = TF_TensorData(trainable);
    o.n_trainable = (size_t)TF_TensorElementCount(trainable);
  }
  int rc = dynemb_apply(t, TF_TensorData(keys), (size_t)n,
                        TF_TensorData(grads), lr, &o, &s);
  if (rc != DYNEMB_OK) {
    fail_engine(ctx, rc, "apply");
    goto done;
  }
  set_scalar_output(ctx, 0, (int64_t)s.applied);
done:
  if (keys) TF_DeleteTensor(keys);
  if (grads) TF_DeleteTensor(grads);
  if (lrt) TF_DeleteTensor(lrt);
  if (trainable) TF_DeleteTensor(trainable);
  if (tickets) TF_DeleteTensor(tickets);
  dynemb_table_release(t);
}

/* ------------------------------------------------------------------------ */
/* DynembEvict                                                               */
/* ------------------------------------------------------------------------ */

static void evict_compute(void *p, TF_OpKernelContext *ctx) {
  const kstate *k = p;
  TF_Tensor *nowt = NULL;
  dynemb_table *t = NULL;
  if (!(nowt = input(ctx, "now"))) goto done;
  int64_t now = 0;
  if (scalar_i64(ctx, nowt, "evict", "now", &now)) goto done;
  if (!(t = find_table(ctx, k, "evict"))) goto done;
  size_t evicted = 0;
  int rc = k->threshold < 0
               ? dynemb_evict(t, now, DYNEMB_TABLE_THRESHOLD, &evicted)
               : dynemb_evict(t, now, k->threshold, &evicted);
  if (rc != DYNEMB_OK) {
    fail_engine(ctx, rc, "evict");
    goto done;
  }
  set_scalar_output(ctx, 0, (int64_t)evicted);
done:
  if (nowt) TF_DeleteTensor(nowt);
  dynemb_table_release(t);
}

/* ------------------------------------------------------------------------ */
/* DynembExport / DynembImport                                               */
/* ------------------------------------------------------------------------ */

/* The eight tensors of a table's contents: DynembExport's outputs and
 * DynembImport's inputs, in this order and with these names. */
enum { EXP_META, EXP_KEYS, EXP_VALUES, EXP_LAST, EXP_CKEYS, EXP_CCOUNTS,
       EXP_CLAST, EXP_STEPS, EXP_N };
static const char *const EXP_NAMES[EXP_N] = {
    "meta", "keys", "values", "last_access", "cand_keys", "cand_counts",
    "cand_last_access", "apply_steps"};

static int out_i64(TF_OpKernelContext *ctx, int i, const int64_t *src,
                   size_t n) {
  const int64_t dims[1] = {(int64_t)n};
  TF_Tensor *o = output(ctx, i, TF_INT64, dims, 1, sizeof(int64_t));
  if (!o) return -1;
  if (n) memcpy(TF_TensorData(o), src, n * sizeof(int64_t));
  TF_DeleteTensor(o);
  return 0;
}

static int out_u32_as_i64(TF_OpKernelContext *ctx, int i, const uint32_t *src,
                          size_t n) {
  const int64_t dims[1] = {(int64_t)n};
  TF_Tensor *o = output(ctx, i, TF_INT64, dims, 1, sizeof(int64_t));
  if (!o) return -1;
  int64_t *d = TF_TensorData(o);
  for (size_t j = 0; j < n; j++) d[j] = src[j];
  TF_DeleteTensor(o);
  return 0;
}

static void export_compute(void *p, TF_OpKernelContext *ctx) {
  const kstate *k = p;
  dynemb_table *t = find_table(ctx, k, "export");
  if (!t) return;
  dynemb_snapshot s;
  memset(&s, 0, sizeof s);
  int rc = dynemb_table_snapshot(t, &s);
  dynemb_table_release(t);
  if (rc != DYNEMB_OK) {
    fail_engine(ctx, rc, "export");
    return;
  }
  const int64_t meta[3] = {s.dim, s.row_floats, s.optimizer_kind};
  if (out_i64(ctx, EXP_META, meta, 3)) goto done;
  if (out_i64(ctx, EXP_KEYS, s.keys, s.rows)) goto done;
  {
    const int64_t dims[2] = {(int64_t)s.rows, s.row_floats};
    TF_Tensor *o = output(ctx, EXP_VALUES, TF_FLOAT, dims, 2, sizeof(float));
    if (!o) goto done;
    if (s.rows)
      memcpy(TF_TensorData(o), s.values,
             s.rows * (size_t)s.row_floats * sizeof(float));
    TF_DeleteTensor(o);
  }
  if (out_u32_as_i64(ctx, EXP_LAST, s.last_access, s.rows)) goto done;
  if (out_i64(ctx, EXP_CKEYS, s.cand_keys, s.candidates)) goto done;
  if (out_u32_as_i64(ctx, EXP_CCOUNTS, s.cand_counts, s.candidates)) goto done;
  if (out_u32_as_i64(ctx, EXP_CLAST, s.cand_last_access, s.candidates))
    goto done;
  set_scalar_output(ctx, EXP_STEPS, (int64_t)s.apply_steps);
done:
  dynemb_snapshot_free(&s);
}

/* Checks an int64 vector input of length n and values in [0, 2^32-1] when
 * `u32` is set. */
static int check_vec(TF_OpKernelContext *ctx, const kstate *k, TF_Tensor *tt,
                     const char *what, int64_t n, int u32) {
  if (TF_TensorType(tt) != TF_INT64 || TF_TensorElementCount(tt) != n) {
    fail(ctx, TF_INVALID_ARGUMENT, "dynemb import: table '%s': '%s' must be "
         "int64 with %lld elements (got %lld): the checkpoint tensors do not "
         "belong together; restore from an intact checkpoint",
         k->table_name, what, (long long)n,
         (long long)TF_TensorElementCount(tt));
    return -1;
  }
  if (u32) {
    const int64_t *d = TF_TensorData(tt);
    for (int64_t j = 0; j < n; j++)
      if (d[j] < 0 || d[j] > (int64_t)UINT32_MAX) {
        fail(ctx, TF_INVALID_ARGUMENT, "dynemb import: table '%s': '%s'[%lld]"
             " = %lld is outside [0, 2^32-1]; the checkpoint is corrupt",
             k->table_name, what, (long long)j, (long long)d[j]);
        return -1;
      }
  }
  return 0;
}

static uint32_t *narrow(const TF_Tensor *tt, int64_t n) {
  uint32_t *o = malloc((size_t)(n ? n : 1) * sizeof *o);
  if (!o) return NULL;
  const int64_t *d = TF_TensorData(tt);
  for (int64_t j = 0; j < n; j++) o[j] = (uint32_t)d[j];
  return o;
}

static void import_compute(void *p, TF_OpKernelContext *ctx) {
  const kstate *k = p;
  TF_Tensor *in[EXP_N] = {0};
  uint32_t *last = NULL, *ccounts = NULL, *clast = NULL;
  dynemb_table *t = NULL;
  for (int i = 0; i < EXP_N; i++)
    if (!(in[i] = input(ctx, EXP_NAMES[i]))) goto done;
  if (check_vec(ctx, k, in[EXP_META], "meta", 3, 0)) goto done;
  const int64_t *meta = TF_TensorData(in[EXP_META]);
  const int64_t rows = TF_TensorElementCount(in[EXP_KEYS]);
  const int64_t cands = TF_TensorElementCount(in[EXP_CKEYS]);
  if (meta[0] < 1 || meta[1] < meta[0] || meta[1] > (1 << 24)) {
    fail(ctx, TF_INVALID_ARGUMENT, "dynemb import: table '%s': checkpoint "
         "meta (dim %lld, row_floats %lld) is invalid; the checkpoint is "
         "corrupt", k->table_name, (long long)meta[0], (long long)meta[1]);
    goto done;
  }
  if (check_vec(ctx, k, in[EXP_KEYS], "keys", rows, 0) ||
      check_vec(ctx, k, in[EXP_LAST], "last_access", rows, 1) ||
      check_vec(ctx, k, in[EXP_CKEYS], "cand_keys", cands, 0) ||
      check_vec(ctx, k, in[EXP_CCOUNTS], "cand_counts", cands, 1) ||
      check_vec(ctx, k, in[EXP_CLAST], "cand_last_access", cands, 1) ||
      check_vec(ctx, k, in[EXP_STEPS], "apply_steps", 1, 0))
    goto done;
  if (TF_TensorType(in[EXP_VALUES]) != TF_FLOAT ||
      TF_TensorElementCount(in[EXP_VALUES]) != rows * meta[1]) {
    fail(ctx, TF_INVALID_ARGUMENT, "dynemb import: table '%s': 'values' must "
         "be float with rows*row_floats = %lld elements (got %lld); the "
         "checkpoint is corrupt", k->table_name, (long long)(rows * meta[1]),
         (long long)TF_TensorElementCount(in[EXP_VALUES]));
    goto done;
  }
  if (!(t = find_table(ctx, k, "import"))) goto done;
  last = narrow(in[EXP_LAST], rows);
  ccounts = narrow(in[EXP_CCOUNTS], cands);
  clast = narrow(in[EXP_CLAST], cands);
  if (!last || !ccounts || !clast) {
    fail(ctx, TF_RESOURCE_EXHAUSTED, "dynemb import: table '%s': out of "
         "memory", k->table_name);
    goto done;
  }
  dynemb_snapshot s;
  memset(&s, 0, sizeof s);
  s.dim = (int)meta[0];
  s.row_floats = (int)meta[1];
  s.optimizer_kind = (int)meta[2];
  s.apply_steps = (uint64_t)*(const int64_t *)TF_TensorData(in[EXP_STEPS]);
  s.rows = (size_t)rows;
  s.keys = TF_TensorData(in[EXP_KEYS]);
  s.values = TF_TensorData(in[EXP_VALUES]);
  s.last_access = last;
  s.candidates = (size_t)cands;
  s.cand_keys = TF_TensorData(in[EXP_CKEYS]);
  s.cand_counts = ccounts;
  s.cand_last_access = clast;
  int rc = dynemb_table_import(t, &s, (unsigned)k->flags,
                               (uint32_t)k->shard_index,
                               (uint32_t)k->shard_count);
  if (rc != DYNEMB_OK) {
    fail_engine(ctx, rc, "import");
    goto done;
  }
  set_scalar_output(ctx, 0, (int64_t)dynemb_table_size(t));
done:
  free(last);
  free(ccounts);
  free(clast);
  for (int i = 0; i < EXP_N; i++)
    if (in[i]) TF_DeleteTensor(in[i]);
  dynemb_table_release(t);
}

/* ------------------------------------------------------------------------ */
/* DynembLoadCheckpoint                                                      */
/* ------------------------------------------------------------------------ */

static void load_compute(void *p, TF_OpKernelContext *ctx) {
  const kstate *k = p;
  TF_Tensor *stampt = NULL;
  dynemb_table *t = NULL;
  if (!(stampt = input(ctx, "stamp"))) goto done;
  dynemb_load_options o = {-1, k->rows_only};
  if (scalar_i64(ctx, stampt, "load", "stamp", &o.stamp)) goto done;
  if (!(t = find_table(ctx, k, "load"))) goto done;
  int rc = dynemb_checkpoint_load(k->dir, t, k->source_name, (unsigned)k->flags,
                                  (uint32_t)k->shard_index,
                                  (uint32_t)k->shard_count, &o);
  if (rc != DYNEMB_OK) {
    fail_engine(ctx, rc, "load");
    goto done;
  }
  set_scalar_output(ctx, 0, (int64_t)dynemb_table_size(t));
done:
  if (stampt) TF_DeleteTensor(stampt);
  dynemb_table_release(t);
}

/* ------------------------------------------------------------------------ */
/* DynembStats                                                               */
/* ------------------------------------------------------------------------ */

static void stats_compute(void *p, TF_OpKernelContext *ctx) {
  const kstate *k = p;
  dynemb_table *t = find_table(ctx, k, "stats");
  if (!t) return;
  dynemb_table_stats s;
  memset(&s, 0, sizeof s);
  dynemb_table_get_stats(t, &s);
  dynemb_table_release(t);
  const int64_t v[20] = {
      (int64_t)s.size,     (int64_t)s.capacity,  (int64_t)s.candidates,
      (int64_t)s.bytes,    (int64_t)s.lookups,   (int64_t)s.hits,
      (int64_t)s.inserted, (int64_t)s.rejected,  (int64_t)s.evicted,
      (int64_t)s.evicted_candidates, (int64_t)s.applied,
      (int64_t)s.dropped_gradients, (int64_t)s.nonfinite_skipped,
      (int64_t)s.apply_steps, (int64_t)s.host_rows, (int64_t)s.ssd_rows,
      (int64_t)s.ssd_bytes, (int64_t)s.ssd_reads, (int64_t)s.ssd_writes,
      (int64_t)s.ssd_lookups};
  out_i64(ctx, 0, v, 20);
}

/* ------------------------------------------------------------------------ */
/* DynembSetAccessThreshold                                                  */
/* ------------------------------------------------------------------------ */

/* Changes the table's admission threshold when the op runs (so a script can
 * change it between steps of one session) and outputs the previous one. */
static void set_access_threshold_compute(void *p, TF_OpKernelContext *ctx) {
  const kstate *k = p;
  TF_Tensor *tt = NULL;
  dynemb_table *t = NULL;
  int64_t threshold = 0;
  if (!(tt = input(ctx, "threshold"))) goto done;
  if (scalar_i64(ctx, tt, "set_access_threshold", "threshold", &threshold))
    goto done;
  /* (mxRec's int32 range: admission counts saturate at its top) */
  if (threshold < 0 || threshold > (int64_t)INT32_MAX) {
    fail(ctx, TF_INVALID_ARGUMENT,
         "dynemb set_access_threshold: table '%s': threshold = %lld is out "
         "of range; give a number of sightings from 0 to 2147483647",
         k->table_name, (long long)threshold);
    goto done;
  }
  if (!(t = find_table(ctx, k, "set_access_threshold"))) goto done;
  dynemb_table_config cfg;
  memset(&cfg, 0, sizeof cfg);
  dynemb_table_get_config(t, &cfg);
  /* mxRec's 0: the threshold stays, the counting of sightings stops; any
   * other threshold resumes it. */
  int rc = threshold == 0 ? dynemb_table_set_admission_counting(t, 0)
                          : dynemb_table_set_access_threshold(
                                t, (uint32_t)threshold);
  if (rc == DYNEMB_OK && threshold != 0)
    rc = dynemb_table_set_admission_counting(t, 1);
  if (rc != DYNEMB_OK) {
    fail_engine(ctx, rc, "set_access_threshold");
    goto done;
  }
  set_scalar_output(ctx, 0, (int64_t)cfg.access_threshold);
done:
  if (tt) TF_DeleteTensor(tt);
  dynemb_table_release(t);
}

/* ------------------------------------------------------------------------ */
/* Registration                                                              */
/* ------------------------------------------------------------------------ */

static void register_op(const char *name, const char *const *attrs,
                        const char *const *inputs, const char *const *outputs,
                        void *(*create)(TF_OpKernelConstruction *),
                        void (*compute)(void *, TF_OpKernelContext *)) {
  register_op_kernel(name, attrs, inputs, outputs, create, compute,
                     delete_state);
}


__attribute__((constructor)) static void dynemb_register_ops(void) {
  register_op("DynembLookup",
              LIST("table_name: string", "is_train: bool = true",
                   "use_tickets: bool = false",
                   "faae_coefficient: int >= 1 = 1", "found: bool = false",
                   "Tkeys: {int32, int64}"),
              LIST("ids: Tkeys", "now: int64", "anchor: float",
                   "tickets: int64"),
              LIST("embeddings: float", "has_row: bool"), create_lookup_prepared,
              lookup_compute);
  register_op("DynembPrepare",
              LIST("table_name: string", "is_train: bool = true",
                   "faae_coefficient: int >= 1 = 1", "Tkeys: {int32, int64}"),
              LIST("ids: Tkeys", "now: int64"), LIST("tickets: int64"),
              create_lookup, prepare_compute);
  register_op("DynembApply",
              LIST("table_name: string", "use_trainable: bool = false",
                   "use_tickets: bool = false"),
              LIST("keys: int64", "grads: float", "learning_rate: float",
                   "trainable: int64", "tickets: int64"),
              LIST("applied: int64"), create_apply, apply_compute);
  register_op("DynembEvict",
              LIST("table_name: string", "threshold: int >= -1 = -1"),
              LIST("now: int64"), LIST("evicted: int64"), create_evict,
              evict_compute);
  register_op("DynembExport", LIST("table_name: string"), NULL,
              LIST("meta: int64", "keys: int64", "values: float",
                   "last_access: int64", "cand_keys: int64",
                   "cand_counts: int64", "cand_last_access: int64",
                   "apply_steps: int64"),
              create_plain, export_compute);
  register_op("DynembImport",
              LIST("table_name: string", "shard_index: int = 0",
                   "shard_count: int = 1", "flags: int = 1"),
              LIST("meta: int64", "keys: int64", "values: float",
                   "last_access: int64", "cand_keys: int64",
                   "cand_counts: int64", "cand_last_access: int64",
                   "apply_steps: int64"),
              LIST("size: int64"), create_import, import_compute);
  register_op("DynembLoadCheckpoint",
              LIST("table_name: string", "shard_index: int = 0",
                   "shard_count: int = 1", "flags: int = 1", "dir: string",
                   "source_name: string", "rows_only: bool = false"),
              LIST("stamp: int64"), LIST("size: int64"), create_load,
              load_compute);
  register_op("DynembStats", LIST("table_name: string"), NULL,
              LIST("stats: int64"), create_plain, stats_compute);
  register_op("DynembSetAccessThreshold", LIST("table_name: string"),
              LIST("threshold: int64"), LIST("previous: int64"), create_plain,
              set_access_threshold_compute);
}
