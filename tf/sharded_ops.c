/*
 * sharded_ops.c -- the op library of several ranks: tables sharded across
 * the processes of an MPI launch, and the dense all-reduce, as TensorFlow
 * ops. Tensor marshalling only: the protocol (routing, the owners' lookup
 * and apply, admission across ranks, the reduce-scatter and all-gather,
 * what a failed rank sends) is the shard room's, comm/shard.h, in C below
 * TensorFlow and tested under mpirun without it.
 *
 * A separate library from tf/dynemb_ops.c so that one worker needs no MPI:
 * this one links the exchange (libdynemb_comm.so, comm/), the shard room
 * (libdynemb_shard.a) and the engine's op library (_dynemb_ops.so, whose
 * loaded copy holds the process's table registry: the kernels here find
 * the same tables by name, and the room's engine calls bind to it too).
 * Python loads it only under a multi-process launch (dynemb/_lib.py).
 *
 * Ops (CPU, stateful; `channel` is the exchange's channel, the same on
 * every rank because every rank builds the same graph in the same order;
 * `ranks` is the world size the graph was built for):
 *   DynembShardedLookup ids, now, anchor -> embeddings [n, dim], and
 *       has_row ([n] with attr `found`, else [0]): dynemb_shard_lookup,
 *       each occurrence counting faae_coefficient sightings.
 *   DynembShardedApply keys, grads, learning_rate -> applied (this rank's):
 *       dynemb_shard_apply, `average` dividing by the rank count.
 *   DynembAllreduce tensors (float, double, int32 or int64; one type per
 *       op) -> reduced: dynemb_shard_allreduce of all tensors at once, by
 *       the sum, mean (float types), product, max, min or rank 0's values
 *       (broadcast).
 *
 * A kernel that fails before it can call the room (an input, a missing
 * table) calls dynemb_shard_failed, so its peers fail at once naming this
 * rank instead of waiting for the exchange's deadline.
 */
#include "kernel_util.h"

#include "dynemb_comm.h"
#include "shard.h"

typedef struct sstate {
  dynemb_shard_op op; /* what runs on the channel (op.table: table_name) */
  char *table_name;   /* lookup, apply */
  int found;          /* lookup: output has_row says which ids read a row */
  int64_t ranks;
} sstate;

static void delete_sstate(void *p) {
  sstate *k = p;
  if (k) free(k->table_name);
  free(k);
}

static int get_int(TF_OpKernelConstruction *c, const char *name, int64_t *v,
                   TF_Status *st) {
  TF_OpKernelConstruction_GetAttrInt64(c, name, v, st);
  return TF_GetCode(st) == TF_OK ? 0 : -1;
}

static int get_bool(TF_OpKernelConstruction *c, const char *name, int *v,
                    TF_Status *st) {
  TF_Bool b = 0;
  TF_OpKernelConstruction_GetAttrBool(c, name, &b, st);
  *v = b ? 1 : 0;
  return TF_GetCode(st) == TF_OK ? 0 : -1;
}

/* The reduction attr's value (enum dynemb_shard_reduction), or -1. */
static int reduction_of(const char *r) {
  static const char *const names[] = {"sum",  "mean", "broadcast",
                                      "prod", "max",  "min"};
  for (int i = 0; i < (int)(sizeof names / sizeof *names); i++)
    if (!strcmp(r, names[i])) return i; /* the enum's order */
  return -1;
}

/* The attrs of a lookup's or an apply's table. */
static int table_attrs(TF_OpKernelConstruction *c, sstate *k, TF_Status *st) {
  dynemb_shard_op *op = &k->op;
  int64_t channel = 0, weight = 1;
  int v = 0;
  if (get_int(c, "channel", &channel, st) || get_int(c, "ranks", &k->ranks, st))
    return -1;
  op->channel = (uint32_t)channel;
  if (op->kind == DYNEMB_SHARD_ALLREDUCE) return 0;
  if (!(k->table_name = get_string_attr(c, "table_name", st))) return -1;
  op->table = k->table_name;
  if (get_bool(c, "replicated", &op->replicated, st)) return -1;
  if (op->kind == DYNEMB_SHARD_APPLY) return get_bool(c, "average", &op->average, st);
  if (get_bool(c, "is_train", &v, st) ||
      get_int(c, "send_count", &op->send_count, st) ||
      get_int(c, "faae_coefficient", &weight, st) ||
      get_bool(c, "found", &k->found, st))
    return -1;
  op->mode = v ? DYNEMB_LOOKUP_TRAIN : DYNEMB_LOOKUP_EVAL;
  if (weight < 1 || weight > INT32_MAX) {
    TF_SetStatus(st, TF_INVALID_ARGUMENT,
                 "dynemb: faae_coefficient must be 1 .. 2^31-1");
    return -1;
  }
  op->weight = (uint32_t)weight;
  return 0;
}

static void *create_sharded(TF_OpKernelConstruction *c, int kind) {
  TF_Status *st = TF_NewStatus();
  sstate *k = calloc(1, sizeof *k);
  if (!k) {
    TF_SetStatus(st, TF_RESOURCE_EXHAUSTED, "dynemb: out of memory");
    goto fail;
  }
  k->op.kind = kind;
  if (table_attrs(c, k, st)) goto fail;
  if (kind == DYNEMB_SHARD_ALLREDUCE) {
    char *r = get_string_attr(c, "reduction", st);
    if (!r) goto fail;
    k->op.reduction = reduction_of(r);
    free(r);
    if (k->op.reduction < 0) {
      TF_SetStatus(st, TF_INVALID_ARGUMENT,
                   "dynemb allreduce: reduction must be 'sum', 'mean', "
                   "'prod', 'max', 'min' or 'broadcast'");
      goto fail;
    }
  }
  TF_DeleteStatus(st);
  return k;
fail:
  TF_OpKernelConstruction_Failure(c, st);
  TF_DeleteStatus(st);
  delete_sstate(k);
  return NULL;
}

static void *create_lookup(TF_OpKernelConstruction *c) {
  return create_sharded(c, DYNEMB_SHARD_LOOKUP);
}
static void *create_apply(TF_OpKernelConstruction *c) {
  return create_sharded(c, DYNEMB_SHARD_APPLY);
}
static void *create_allreduce(TF_OpKernelConstruction *c) {
  return create_sharded(c, DYNEMB_SHARD_ALLREDUCE);
}

/* The world, checked against the size the graph was built for; NULL after
 * failing the kernel. */
static dynemb_comm *world(TF_OpKernelContext *ctx, const sstate *k,
                          const char *op) {
  dynemb_comm *c = dynemb_comm_world();
  if (!c) {
    fail(ctx, TF_FAILED_PRECONDITION,
         "dynemb %s: this graph was built for %lld ranks, but this process "
         "has not joined an MPI launch; run it under mpirun -np %lld",
         op, (long long)k->ranks, (long long)k->ranks);
    return NULL;
  }
  if (dynemb_comm_size(c) != k->ranks) {
    fail(ctx, TF_FAILED_PRECONDITION,
         "dynemb %s: this graph was built for %lld ranks, but the launch has "
         "%d; build the graph in the process that runs it",
         op, (long long)k->ranks, dynemb_comm_size(c));
    return NULL;
  }
  return c;
}

/* Fails the kernel with the room's error. */
static void fail_shard(TF_OpKernelContext *ctx, const dynemb_shard_error *e) {
  TF_Code code = TF_INTERNAL;
  switch (e->code) {
  case DYNEMB_SHARD_EINVAL: code = TF_INVALID_ARGUMENT; break;
  case DYNEMB_SHARD_ENOMEM: code = TF_RESOURCE_EXHAUSTED; break;
  case DYNEMB_SHARD_EENGINE: code = code_of(e->engine_code); break;
  case DYNEMB_SHARD_EEXCHANGE: code = TF_UNAVAILABLE; break;
  case DYNEMB_SHARD_EPEER: code = TF_ABORTED; break;
  case DYNEMB_SHARD_EMISMATCH: code = TF_FAILED_PRECONDITION; break;
  default: break;
  }
  fail(ctx, code, "%s", e->msg);
}

/* This rank's part of the table, or NULL after failing the kernel. */
static dynemb_table *find_table(TF_OpKernelContext *ctx, const sstate *k,
                                const char *op) {
  dynemb_table *t = NULL;
  if (dynemb_table_find(k->table_name, &t) == DYNEMB_OK) return t;
  fail(ctx, TF_NOT_FOUND,
       "dynemb %s: table '%s' is not registered in this process; create it "
       "with dynemb.create_table(name='%s', ...) on every rank before running "
       "the graph",
       op, k->table_name, k->table_name);
  return NULL;
}

/* ------------------------------------------------------------------------ */
/* DynembShardedLookup                                                       */
/* ------------------------------------------------------------------------ */

static void lookup_compute(void *p, TF_OpKernelContext *ctx) {
  sstate *k = p;
  TF_Tensor *ids = NULL, *nowt = NULL, *out = NULL, *has = NULL;
  dynemb_table *t = NULL;
  int64_t *wide = NULL;
  int64_t now = 0, n = 0;
  const int64_t *keys = NULL;
  dynemb_comm *c = world(ctx, k, "sharded lookup");
  if (!c) return;
  int ok = (ids = input(ctx, "ids")) && (nowt = input(ctx, "now")) &&
           !scalar_i64(ctx, nowt, "sharded lookup", "now", &now) &&
           (t = find_table(ctx, k, "sharded lookup"));
  if (ok) {
    n = TF_TensorElementCount(ids);
    const int64_t dims[2] = {n, dynemb_table_dim(t)},
                  hdims[1] = {k->found ? n : 0};
    ok = (out = output(ctx, 0, TF_FLOAT, dims, 2, sizeof(float))) &&
         (has = output(ctx, 1, TF_BOOL, hdims, 1, sizeof(TF_Bool)));
  }
  if (ok && n > 0)
    ok = (keys = ids_as_int64(ctx, k->table_name, ids, n, "sharded lookup",
                              &wide)) != NULL;
  dynemb_shard_error e;
  if (!ok)
    dynemb_shard_failed(c, &k->op);
  else if (dynemb_shard_lookup(c, &k->op, t, keys, (size_t)n, now,
                               TF_TensorData(out),
                               k->found ? TF_TensorData(has) : NULL, &e))
    fail_shard(ctx, &e);
  free(wide);
  if (out) TF_DeleteTensor(out);
  if (has) TF_DeleteTensor(has);
  if (ids) TF_DeleteTensor(ids);
  if (nowt) TF_DeleteTensor(nowt);
  dynemb_table_release(t);
}

/* ------------------------------------------------------------------------ */
/* DynembShardedApply                                                        */
/* ------------------------------------------------------------------------ */

static void apply_compute(void *p, TF_OpKernelContext *ctx) {
  sstate *k = p;
  TF_Tensor *keyt = NULL, *grads = NULL, *lrt = NULL;
  dynemb_table *t = NULL;
  dynemb_comm *c = world(ctx, k, "sharded apply");
  if (!c) return;
  int ok = (keyt = input(ctx, "keys")) && (grads = input(ctx, "grads")) &&
           (lrt = input(ctx, "learning_rate")) &&
           (t = find_table(ctx, k, "sharded apply"));
  int64_t n = ok ? TF_TensorElementCount(keyt) : 0,
          dim = ok ? dynemb_table_dim(t) : 0;
  if (ok && (TF_TensorType(keyt) != TF_INT64 ||
             TF_TensorElementCount(grads) != n * dim ||
             TF_TensorElementCount(lrt) != 1)) {
    fail(ctx, TF_INVALID_ARGUMENT,
         "dynemb sharded apply: table '%s' (dim %lld): got %lld gradient "
         "values for %lld int64 keys and a learning rate of %lld values; "
         "expected keys*dim values and a scalar rate",
         k->table_name, (long long)dim,
         (long long)TF_TensorElementCount(grads), (long long)n,
         (long long)TF_TensorElementCount(lrt));
    ok = 0;
  }
  dynemb_shard_error e;
  size_t applied = 0;
  if (!ok)
    dynemb_shard_failed(c, &k->op);
  else if (dynemb_shard_apply(c, &k->op, t, TF_TensorData(keyt), (size_t)n,
                              TF_TensorData(grads),
                              *(const float *)TF_TensorData(lrt), &applied,
                              &e))
    fail_shard(ctx, &e);
  else
    set_scalar_output(ctx, 0, (int64_t)applied);
  if (keyt) TF_DeleteTensor(keyt);
  if (grads) TF_DeleteTensor(grads);
  if (lrt) TF_DeleteTensor(lrt);
  dynemb_table_release(t);
}

/* ------------------------------------------------------------------------ */
/* DynembAllreduce                                                           */
/* ------------------------------------------------------------------------ */

/* Every input tensor, flattened into one buffer; `first` gets each one's
 * first element. NULL after failing the kernel. */
static char *flatten(TF_OpKernelContext *ctx, TF_Tensor **in, int n_in,
                     int64_t *first, TF_DataType *type, size_t *es) {
  for (int i = 0; i < n_in; i++)
    first[i + 1] = first[i] + TF_TensorElementCount(in[i]);
  /* (the op's definition gives all tensors one type) */
  *type = TF_TensorType(in[0]);
  *es = TF_DataTypeSize(*type);
  char *flat = malloc((size_t)(first[n_in] ? first[n_in] : 1) * *es);
  if (!flat) {
    fail(ctx, TF_RESOURCE_EXHAUSTED, "dynemb allreduce: out of memory");
    return NULL;
  }
  for (int i = 0; i < n_in; i++)
    memcpy(flat + (size_t)first[i] * *es, TF_TensorData(in[i]),
           (size_t)(first[i + 1] - first[i]) * *es);
  return flat;
}

/* Output i: input i's shape, its part of `flat`. */
static int unflatten(TF_OpKernelContext *ctx, TF_Tensor **in, int n_in,
                     const int64_t *first, TF_DataType type, size_t es,
                     const char *flat) {
  for (int i = 0; i < n_in; i++) {
    int nd = TF_NumDims(in[i]);
    int64_t dims[32];
    if (nd > 32) {
      fail(ctx, TF_INVALID_ARGUMENT,
           "dynemb allreduce: tensor %d has rank %d; at most 32", i, nd);
      return -1;
    }
    for (int d = 0; d < nd; d++) dims[d] = TF_Dim(in[i], d);
    TF_Tensor *o = output(ctx, i, type, dims, nd, es);
    if (!o) return -1;
    memcpy(TF_TensorData(o), flat + (size_t)first[i] * es,
           (size_t)(first[i + 1] - first[i]) * es);
    TF_DeleteTensor(o);
  }
  return 0;
}

static void allreduce_compute(void *p, TF_OpKernelContext *ctx) {
  sstate *k = p;
  dynemb_comm *c = world(ctx, k, "allreduce");
  if (!c) return;
  TF_Status *st = TF_NewStatus();
  TF_InputRange_Args range = {.struct_size = TF_InputRange_Args_STRUCT_SIZE,
                              .priv = NULL,
                              .status = st};
  TF_InputRange(ctx, "tensors", &range);
  const int n_in = TF_GetCode(st) == TF_OK ? range.stop - range.start : 0;
  TF_Tensor **in = calloc((size_t)(n_in ? n_in : 1), sizeof *in);
  int64_t *first = calloc((size_t)n_in + 1, sizeof *first);
  char *flat = NULL;
  TF_DataType type = TF_FLOAT;
  size_t es = sizeof(float);
  int ok = TF_GetCode(st) == TF_OK && in && first && n_in > 0;
  if (!ok) fail(ctx, TF_INTERNAL, "dynemb allreduce: cannot read its inputs");
  for (int i = 0; ok && i < n_in; i++) {
    TF_GetInput(ctx, range.start + i, &in[i], st);
    if (TF_GetCode(st) != TF_OK) {
      fail(ctx, TF_INTERNAL, "dynemb allreduce: cannot read tensor %d", i);
      ok = 0;
    }
  }
  if (ok) ok = (flat = flatten(ctx, in, n_in, first, &type, &es)) != NULL;
  dynemb_shard_error e;
  if (!ok)
    dynemb_shard_failed(c, &k->op);
  else if (dynemb_shard_allreduce(c, &k->op, (int)type, flat,
                                  (size_t)first[n_in], &e))
    fail_shard(ctx, &e);
  else
    unflatten(ctx, in, n_in, first, type, es, flat);
  for (int i = 0; in && i < n_in; i++)
    if (in[i]) TF_DeleteTensor(in[i]);
  free(in);
  free(first);
  free(flat);
  TF_DeleteStatus(st);
}

/* ------------------------------------------------------------------------ */
/* Registration                                                              */
/* ------------------------------------------------------------------------ */

__attribute__((constructor)) static void dynemb_register_sharded_ops(void) {
  register_op_kernel(
      "DynembShardedLookup",
      LIST("table_name: string", "is_train: bool = true", "send_count: int = 0",
           "faae_coefficient: int >= 1 = 1", "found: bool = false",
           "replicated: bool = false", "channel: int", "ranks: int",
           "Tkeys: {int32, int64}"),
      LIST("ids: Tkeys", "now: int64", "anchor: float"),
      LIST("embeddings: float", "has_row: bool"), create_lookup,
      lookup_compute, delete_sstate);
  register_op_kernel(
      "DynembShardedApply",
      LIST("table_name: string", "average: bool = false",
           "replicated: bool = false", "channel: int", "ranks: int"),
      LIST("keys: int64", "grads: float", "learning_rate: float"),
      LIST("applied: int64"), create_apply, apply_compute, delete_sstate);
  register_op_kernel("DynembAllreduce",
                     LIST("reduction: string = 'sum'", "channel: int",
                          "ranks: int", "K: int >= 1",
                          "T: {float, double, int32, int64} = DT_FLOAT"),
                     LIST("tensors: K * T"), LIST("reduced: K * T"),
                     create_allreduce, allreduce_compute, delete_sstate);
}
