/*
 * sharded_ops.c -- the op library of several ranks: tables sharded across
 * the processes of an MPI launch, and the dense all-reduce.
 *
 * A separate library from tf/dynemb_ops.c so that one worker needs no MPI:
 * this one links the exchange (libdynemb_comm.so, comm/) and the engine's
 * op library (_dynemb_ops.so, whose loaded copy holds the process's table
 * registry: the kernels here find the same tables by name). Python loads it
 * only under a multi-process launch (dynemb/_lib.py).
 *
 * Each rank owns the keys that dynemb_key_shard(key, ranks) assigns to it;
 * its local table holds only those. Ops (CPU, stateful; `channel` is the
 * exchange's channel, the same on every rank because every rank builds
 * the same graph in the same order; `ranks` is the world size the graph was
 * built for):
 *   DynembShardedLookup ids, now, anchor -> embeddings [n, dim]:
 *       each id goes to its owner, which looks up the ids of every rank in
 *       rank order (so admission counts every sighting of the global batch,
 *       in the order one process would count the concatenated batch) with
 *       the largest `now` of all ranks, and the rows come back; each
 *       occurrence counts faae_coefficient sightings. With attr `found`,
 *       has_row [n] says which ids read a row (the others read the
 *       default: not admitted, or unknown to an eval lookup); else [0].
 *   DynembShardedApply keys, grads, learning_rate -> applied (this rank's):
 *       each (key, gradient row) goes to its owner, which applies every
 *       rank's rows in one dynemb_apply (so each key is updated once per
 *       step with the gradient summed over ranks, as for the global batch);
 *       `average` divides the rows by the rank count first.
 *   DynembAllreduce tensors (float, double, int32 or int64; one type per
 *       op) -> reduced: the elementwise sum, mean (float types), product,
 *       max, min or rank 0's values (broadcast) on every rank: a
 *       reduce-scatter and an all-gather, reducing in rank order so every
 *       rank gets the same bits.
 *
 * Every part a rank sends begins with a status word: a rank whose kernel
 * failed still takes part in the exchange with a nonzero status, so its
 * peers fail at once with an error naming it instead of waiting for the
 * exchange's deadline.
 */
#include "kernel_util.h"

#include <stdatomic.h>

#include "dynemb_comm.h"
#include "route.h"

typedef struct sstate {
  char *table_name;   /* lookup, apply */
  int is_train;       /* lookup */
  int64_t send_count; /* lookup: unique ids per owner at most (0: any) */
  int64_t weight;     /* lookup: sightings per occurrence (faae_coefficient) */
  int found;          /* lookup: output has_row says which ids read a row */
  int replicated;     /* lookup, apply: every rank holds the whole table */
  int average;        /* apply */
  int64_t channel, ranks;
  int reduction; /* allreduce */
  _Atomic int labelled; /* the comm knows what the channel is */
} sstate;

enum { REDUCE_SUM, REDUCE_MEAN, REDUCE_BROADCAST, REDUCE_PROD, REDUCE_MAX,
       REDUCE_MIN };

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

/* `what`: "lookup", "apply" or "allreduce" (which attrs the op has). */
static void *create_sharded(TF_OpKernelConstruction *c, const char *what) {
  TF_Status *st = TF_NewStatus();
  sstate *k = calloc(1, sizeof *k);
  if (!k) {
    TF_SetStatus(st, TF_RESOURCE_EXHAUSTED, "dynemb: out of memory");
    goto fail;
  }
  if (get_int(c, "channel", &k->channel, st) ||
      get_int(c, "ranks", &k->ranks, st))
    goto fail;
  if (strcmp(what, "allreduce") == 0) {
    char *r = get_string_attr(c, "reduction", st);
    if (!r) goto fail;
    static const char *const names[] = {"sum",  "mean", "broadcast",
                                        "prod", "max",  "min"};
    int known = 0;
    for (int i = 0; i < (int)(sizeof names / sizeof *names); i++)
      if (!strcmp(r, names[i])) {
        k->reduction = i; /* the enum's order */
        known = 1;
      }
    if (!known)
      TF_SetStatus(st, TF_INVALID_ARGUMENT,
                   "dynemb allreduce: reduction must be 'sum', 'mean', "
                   "'prod', 'max', 'min' or 'broadcast'");
    free(r);
    if (!known) goto fail;
  } else {
    k->table_name = get_string_attr(c, "table_name", st);
    if (!k->table_name) goto fail;
    if (strcmp(what, "lookup") == 0 &&
        (get_bool(c, "is_train", &k->is_train, st) ||
         get_int(c, "send_count", &k->send_count, st) ||
         get_int(c, "faae_coefficient", &k->weight, st) ||
         get_bool(c, "found", &k->found, st)))
      goto fail;
    if (strcmp(what, "lookup") == 0 && (k->weight < 1 || k->weight > INT32_MAX)) {
      TF_SetStatus(st, TF_INVALID_ARGUMENT,
                   "dynemb: faae_coefficient must be 1 .. 2^31-1");
      goto fail;
    }
    if (strcmp(what, "apply") == 0 && get_bool(c, "average", &k->average, st))
      goto fail;
    if (get_bool(c, "replicated", &k->replicated, st)) goto fail;
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
  return create_sharded(c, "lookup");
}
static void *create_apply(TF_OpKernelConstruction *c) {
  return create_sharded(c, "apply");
}
static void *create_allreduce(TF_OpKernelConstruction *c) {
  return create_sharded(c, "allreduce");
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
  /* The channel's name in the errors of every rank (which op, which table,
   * train or eval): once per kernel, the state is the kernel's own. */
  sstate *mk = (sstate *)k;
  if (!atomic_load_explicit(&mk->labelled, memory_order_relaxed)) {
    static const char *const reductions[] = {"sum", "mean", "broadcast",
                                             "prod", "max", "min"};
    char label[256];
    int per_run = 2; /* lookups and all-reduces: two exchanges per run */
    if (!k->table_name) {
      snprintf(label, sizeof label, "dense all-reduce (%s)",
               reductions[k->reduction]);
    } else if (!strcmp(op, "sharded apply")) {
      snprintf(label, sizeof label, "gradients of table '%s'", k->table_name);
      per_run = 1;
    } else {
      snprintf(label, sizeof label, "lookup of table '%s' (%s)", k->table_name,
               k->is_train ? "train" : "eval");
    }
    if (!dynemb_comm_label(c, (uint32_t)k->channel, label, per_run, NULL, 0))
      atomic_store_explicit(&mk->labelled, 1, memory_order_relaxed);
  }
  return c;
}

/* One exchange on the kernel's channel; on failure fails the kernel. */
static int exchange(TF_OpKernelContext *ctx, dynemb_comm *c, const sstate *k,
                    const char *what, const void *send, const size_t *soff,
                    const size_t *slen, void **recv, size_t *roff,
                    size_t *rlen) {
  char err[1024];
  if (dynemb_comm_alltoallv(c, (uint32_t)k->channel, send, soff, slen, recv,
                            roff, rlen, err, sizeof err) == 0)
    return 0;
  fail(ctx, TF_UNAVAILABLE, "dynemb %s%s%s%s: %s", what,
       k->table_name ? " of table '" : "", k->table_name ? k->table_name : "",
       k->table_name ? "'" : "", err);
  return -1;
}

/* Per-rank arrays of the exchanges (offsets and lengths, sent and
 * received), one allocation. */
typedef struct parts {
  size_t *soff, *slen, *roff, *rlen;
} parts;

static int parts_alloc(parts *pt, int n) {
  size_t *a = calloc((size_t)n * 4, sizeof *a);
  if (!a) return -1;
  *pt = (parts){a, a + n, a + 2 * n, a + 3 * n};
  return 0;
}

/* Status words: 0 is fine; a failing rank sends this. */
#define PART_FAILED 1

/* The first rank p (not `me`) whose part begins with a nonzero status, or
 * -1. Parts shorter than a status word count as failed. */
static int failed_peer(const char *recv, const size_t *roff, const size_t *rlen,
                       int n, int me) {
  for (int p = 0; p < n; p++) {
    if (p == me) continue;
    int64_t s = PART_FAILED;
    if (rlen[p] >= sizeof s) memcpy(&s, recv + roff[p], sizeof s);
    if (s != 0) return p;
  }
  return -1;
}

/* Takes part in `times` more exchanges of the call with a failed head only:
 * this rank's kernel failed (and says why), and every rank must run every
 * exchange of the call, so that its peers fail at once instead of at the
 * deadline and the channel's sequence stays the same on every rank. */
static void exchange_failed(dynemb_comm *c, const sstate *k, parts *pt, int n,
                            int times) {
  int64_t head[4] = {PART_FAILED, 0, 0, 0};
  for (int r = 0; r < n; r++) {
    pt->soff[r] = 0;
    pt->slen[r] = sizeof head;
  }
  char err[256];
  for (int i = 0; i < times; i++) {
    void *recv = NULL;
    dynemb_comm_alltoallv(c, (uint32_t)k->channel, head, pt->soff, pt->slen,
                          &recv, pt->roff, pt->rlen, err, sizeof err);
    free(recv);
  }
}

static void fail_peer(TF_OpKernelContext *ctx, const sstate *k, const char *op,
                      int p) {
  fail(ctx, TF_ABORTED,
       "dynemb %s of table '%s': rank %d failed this step (its own error "
       "says why)",
       op, k->table_name ? k->table_name : "-", p);
}

/* mxRec's send_count (static-shape mode): the unique ids this rank sends
 * to each owner must fit it. 0 when they do; otherwise fails the kernel
 * naming the owner, the count and the fix. */
static int check_send_count(TF_OpKernelContext *ctx, const sstate *k,
                            const dynemb_route *rt) {
  if (k->send_count <= 0) return 0;
  for (int r = 0; r < rt->ranks; r++) {
    size_t unique = rt->first[r + 1] - rt->first[r];
    if (unique > (size_t)k->send_count) {
      fail(ctx, TF_INVALID_ARGUMENT,
           "dynemb sharded lookup: table '%s': this batch sends %zu unique ids "
           "to rank %d, above send_count = %lld; raise send_count to at least "
           "%zu (static-shape mode, init(use_dynamic=False))",
           k->table_name, unique, r, (long long)k->send_count, unique);
      return -1;
    }
  }
  return 0;
}

/* Lays out one part per rank: part r is head + bytes(r) long. Returns the
 * send buffer (zeroed), or NULL after failing the kernel. */
static char *layout(TF_OpKernelContext *ctx, parts *pt, int n, size_t head,
                    size_t (*bytes)(const void *, int), const void *arg,
                    const char *op) {
  size_t total = 0;
  for (int r = 0; r < n; r++) {
    pt->soff[r] = total;
    pt->slen[r] = head + (bytes ? bytes(arg, r) : 0);
    total += pt->slen[r];
    if (pt->slen[r] > (size_t)INT32_MAX - 64) { /* one MPI message */
      fail(ctx, TF_INVALID_ARGUMENT,
           "dynemb %s: this batch sends %zu bytes to rank %d, more than one "
           "MPI message holds (2 GiB); use smaller batches or more ranks",
           op, pt->slen[r], r);
      return NULL;
    }
  }
  char *send = calloc(total ? total : 1, 1);
  if (!send) fail(ctx, TF_RESOURCE_EXHAUSTED, "dynemb %s: out of memory", op);
  return send;
}

/* ------------------------------------------------------------------------ */
/* DynembShardedLookup                                                       */
/* ------------------------------------------------------------------------ */

/* Keys part: {status, now, unique keys u, flags} then u keys and, with flag
 * COUNTS, their u occurrence counts (uint32; else each occurs once); flag
 * FOUND: the asking lookup needs to know which keys read the default (an
 * eval lookup's owner then says so too, whatever its own op's attr).
 * Rows part: {status, dim, u, flags} then, with flag DEFAULTS, u counts of
 * the occurrences (the first ones) that read the default value (before the
 * key's admission; uint32; else none), then u rows. */
enum { HEAD = 4 * sizeof(int64_t), COUNTS = 1, FOUND = 2, DEFAULTS = 1 };

/* The route's group that part r carries: owner r's keys, or all keys for a
 * replicated table (its route has one group, sent to every rank). */
static int group_of(const sstate *k, int r) { return k->replicated ? 0 : r; }

typedef struct keys_arg {
  const dynemb_route *rt;
  const int *with_counts;
  const sstate *k;
} keys_arg;

static size_t keys_bytes(const void *p, int r) {
  const keys_arg *a = p;
  int o = group_of(a->k, r);
  size_t u = a->rt->first[o + 1] - a->rt->first[o];
  return u * sizeof(int64_t) +
         (a->with_counts[r] & COUNTS ? u * sizeof(uint32_t) : 0);
}

/* What an owner received from one rank. */
typedef struct asked {
  int64_t status, now, u, flags;
  const char *keys;   /* [u] int64 (unaligned: read with memcpy) */
  const char *counts; /* [u] uint32, or NULL: ones */
  size_t first;       /* its first key among the owner's */
} asked;

static uint32_t count_of(const asked *a, size_t j) {
  uint32_t c = 1;
  if (a->counts) memcpy(&c, a->counts + j * sizeof c, sizeof c);
  return c;
}

/* The owner's side: every rank's unique keys (`a`, n ranks) looked up in
 * rank order (train: each occurrence counted, as one process would count
 * the concatenated batch), one row per unique key into rows[total][dim]
 * and, per unique key, how many of its leading occurrences read the
 * default value (defaults[total]). */
static int owner_lookup(dynemb_table *t, const sstate *k, const asked *a, int n,
                        size_t total, int64_t now, float *rows,
                        uint32_t *defaults) {
  int found = 0; /* (any asking rank's lookup wants it) */
  for (int r = 0; r < n; r++) found |= (a[r].flags & FOUND) != 0;
  int64_t *ukeys = malloc((total ? total : 1) * sizeof *ukeys);
  if (!ukeys) return DYNEMB_ENOMEM;
  for (int r = 0; r < n; r++)
    if (a[r].u) memcpy(ukeys + a[r].first, a[r].keys, (size_t)a[r].u * 8);
  memset(defaults, 0, total * sizeof *defaults);
  int rc = DYNEMB_OK;
  if (!k->is_train && !found) { /* reads only: every occurrence alike */
    rc = total ? dynemb_lookup(t, ukeys, total, DYNEMB_LOOKUP_EVAL, 0, NULL,
                               rows, NULL)
               : DYNEMB_OK;
    free(ukeys);
    return rc;
  }
  if (!k->is_train) { /* and which keys have no row: all their occurrences */
    dynemb_ticket *tk = malloc((total ? total : 1) * sizeof *tk);
    rc = tk ? DYNEMB_OK : DYNEMB_ENOMEM;
    if (!rc && total) /* (rows and which keys have one: one pass) */
      rc = dynemb_lookup(t, ukeys, total, DYNEMB_LOOKUP_EVAL, 0, NULL, rows, tk);
    for (size_t g = 0; !rc && g < total; g++)
      defaults[g] = tk[g] == DYNEMB_NOT_ADMITTED ? UINT32_MAX : 0;
    free(tk);
    free(ukeys);
    return rc;
  }
  size_t expanded = 0;
  for (int r = 0; r < n; r++)
    for (int64_t j = 0; j < a[r].u; j++) expanded += count_of(&a[r], (size_t)j);
  int64_t *each = malloc((expanded ? expanded : 1) * sizeof *each);
  dynemb_ticket *tickets = malloc((expanded ? expanded : 1) * sizeof *tickets);
  dynemb_ticket *pick = malloc((total ? total : 1) * sizeof *pick);
  if (!each || !tickets || !pick) rc = DYNEMB_ENOMEM;
  size_t e = 0;
  for (int r = 0; !rc && r < n; r++)
    for (int64_t j = 0; j < a[r].u; j++)
      for (uint32_t c = count_of(&a[r], (size_t)j); c; c--)
        each[e++] = ukeys[a[r].first + (size_t)j];
  /* (also with no keys; the engine then leaves the table as it is) */
  if (!rc)
    rc = dynemb_prepare(t, each, expanded, DYNEMB_LOOKUP_TRAIN, now,
                        &(dynemb_lookup_opts){.weight = (uint32_t)k->weight},
                        tickets);
  /* A key's occurrences that came before its admission are the first ones
   * (once admitted within a call it stays so): count them, and read the row
   * through the first admitted occurrence's ticket. */
  e = 0;
  for (int r = 0; !rc && r < n; r++)
    for (int64_t j = 0; j < a[r].u; j++) {
      size_t g = a[r].first + (size_t)j;
      uint32_t c = count_of(&a[r], (size_t)j), m = 0;
      while (m < c && tickets[e + m] == DYNEMB_NOT_ADMITTED) m++;
      defaults[g] = m;
      pick[g] = m < c ? tickets[e + m] : DYNEMB_NOT_ADMITTED;
      e += c;
    }
  /* (a row gone since the prepare, evicted or cleared meanwhile, reads the
   * default for every occurrence: said so) */
  unsigned char *has = found && total ? malloc(total) : NULL;
  if (!rc && found && total && !has) rc = DYNEMB_ENOMEM;
  if (!rc && total)
    rc = dynemb_lookup_prepared(t, ukeys, pick, total, rows, has);
  for (int r = 0; !rc && has && r < n; r++)
    for (int64_t j = 0; j < a[r].u; j++) {
      size_t g = a[r].first + (size_t)j;
      if (!has[g]) defaults[g] = count_of(&a[r], (size_t)j);
    }
  free(has);
  free(each);
  free(tickets);
  free(pick);
  free(ukeys);
  return rc;
}

typedef struct rows_arg {
  const asked *a;
  const int *with_defaults;
  size_t row_bytes;
  int failed;
} rows_arg;

static size_t rows_bytes(const void *p, int r) {
  const rows_arg *x = p;
  if (x->failed) return 0;
  size_t u = (size_t)x->a[r].u;
  return (x->with_defaults[r] ? u * sizeof(uint32_t) : 0) + u * x->row_bytes;
}

/* The table's default row as this rank has it (a read through a "not
 * admitted" ticket; `key` is any key), malloc'd; NULL after failing the
 * kernel. */
static float *default_row(TF_OpKernelContext *ctx, dynemb_table *t,
                          const int64_t *key, size_t row_bytes) {
  const dynemb_ticket none = DYNEMB_NOT_ADMITTED;
  float *def = malloc(row_bytes ? row_bytes : 1);
  int rc =
      def ? dynemb_lookup_prepared(t, key, &none, 1, def, NULL) : DYNEMB_ENOMEM;
  if (rc != DYNEMB_OK) {
    fail_engine(ctx, rc, "sharded lookup");
    free(def);
    return NULL;
  }
  return def;
}

static void lookup_compute(void *p, TF_OpKernelContext *ctx) {
  const sstate *k = p;
  TF_Tensor *ids = NULL, *nowt = NULL, *out = NULL, *has = NULL;
  dynemb_table *t = NULL;
  int64_t *wide = NULL;
  char *send = NULL, *recv = NULL, *rows_recv = NULL;
  float *rows = NULL, *def = NULL;
  uint32_t *defaults = NULL;
  asked *a = NULL;
  int *flags = NULL;
  dynemb_route rt = {0};
  parts pt = {0};
  dynemb_comm *c = world(ctx, k, "sharded lookup");
  if (!c) return;
  const int n_ranks = dynemb_comm_size(c), me = dynemb_comm_rank(c);
  int64_t status = 0, now = 0, dim = 0, n = 0;
  const int64_t *keys = NULL;
  if (parts_alloc(&pt, n_ranks)) {
    fail(ctx, TF_RESOURCE_EXHAUSTED, "dynemb sharded lookup: out of memory");
    return; /* (the peers time out naming this rank) */
  }
  a = calloc((size_t)n_ranks, sizeof *a);
  flags = calloc((size_t)n_ranks, sizeof *flags);
  if (!a || !flags) {
    fail(ctx, TF_RESOURCE_EXHAUSTED, "dynemb sharded lookup: out of memory");
    exchange_failed(c, k, &pt, n_ranks, 2);
    goto done;
  }
  /* Local failures (reported by the kernel already) still take part in
   * both exchanges, with a failed status. */
  int found = 0;
  if (!(ids = input(ctx, "ids")) || !(nowt = input(ctx, "now")) ||
      scalar_i64(ctx, nowt, "sharded lookup", "now", &now) ||
      !(found = dynemb_table_find(k->table_name, &t) == DYNEMB_OK)) {
    if (ids && nowt && !found && !t)
      fail(ctx, TF_NOT_FOUND,
           "dynemb sharded lookup: table '%s' is not registered in this "
           "process; create it with dynemb.create_table(name='%s', ...) on "
           "every rank before running the graph",
           k->table_name, k->table_name);
    status = PART_FAILED;
  }
  if (!status) {
    dim = dynemb_table_dim(t);
    n = TF_TensorElementCount(ids);
    const int64_t dims[2] = {n, dim}, hdims[1] = {k->found ? n : 0};
    if (!(out = output(ctx, 0, TF_FLOAT, dims, 2, sizeof(float))) ||
        !(has = output(ctx, 1, TF_BOOL, hdims, 1, sizeof(TF_Bool))))
      status = PART_FAILED;
  }
  if (!status && n > 0 &&
      !(keys =
            ids_as_int64(ctx, k->table_name, ids, n, "sharded lookup", &wide)))
    status = PART_FAILED;
  if (!status && dynemb_route_build(&rt, keys, (size_t)n,
                                    k->replicated ? 1 : n_ranks)) {
    fail(ctx, TF_RESOURCE_EXHAUSTED, "dynemb sharded lookup: out of memory");
    status = PART_FAILED;
  }
  if (!status && check_send_count(ctx, k, &rt)) status = PART_FAILED;
  /* First exchange: each owner gets its unique keys and their counts. */
  for (int r = 0; !status && r < n_ranks; r++)
    for (size_t g = rt.first[group_of(k, r)]; g < rt.first[group_of(k, r) + 1];
         g++)
      if (rt.ucount[g] > 1) flags[r] = COUNTS;
  for (int r = 0; k->found && r < n_ranks; r++) flags[r] |= FOUND;
  keys_arg ka = {&rt, flags, k};
  if (!(send = layout(ctx, &pt, n_ranks, HEAD, status ? NULL : keys_bytes, &ka,
                      "sharded lookup"))) {
    exchange_failed(c, k, &pt, n_ranks, 2);
    goto done;
  }
  for (int r = 0; r < n_ranks; r++) {
    int o = group_of(k, r);
    size_t u = status ? 0 : rt.first[o + 1] - rt.first[o];
    int64_t head[4] = {status, now, (int64_t)u, flags[r]};
    char *part = send + pt.soff[r];
    memcpy(part, head, sizeof head);
    if (!u) continue;
    memcpy(part + HEAD, rt.ukey + rt.first[o], u * sizeof(int64_t));
    if (flags[r] & COUNTS)
      memcpy(part + HEAD + u * sizeof(int64_t), rt.ucount + rt.first[o],
             u * sizeof(uint32_t));
  }
  if (exchange(ctx, c, k, "sharded lookup", send, pt.soff, pt.slen,
               (void **)&recv, pt.roff, pt.rlen)) {
    exchange_failed(c, k, &pt, n_ranks, 1);
    goto done;
  }
  /* This rank as owner. */
  int bad = failed_peer(recv, pt.roff, pt.rlen, n_ranks, me);
  int64_t owner_status = status || bad >= 0 ? PART_FAILED : 0;
  size_t total = 0;
  int64_t now_max = 0;
  for (int r = 0; !owner_status && r < n_ranks; r++) {
    const char *part = recv + pt.roff[r];
    int64_t head[4] = {0, 0, 0, 0};
    if (pt.rlen[r] >= HEAD) memcpy(head, part, sizeof head);
    a[r] = (asked){head[0], head[1],     head[2] < 0 ? 0 : head[2],
                   head[3], part + HEAD, NULL,
                   total};
    size_t want = HEAD + (size_t)a[r].u * sizeof(int64_t) +
                  (a[r].flags & COUNTS ? (size_t)a[r].u * sizeof(uint32_t) : 0);
    if (pt.rlen[r] != want) {
      fail(ctx, TF_INTERNAL,
           "dynemb sharded lookup of table '%s': rank %d sent a part of %zu "
           "bytes, not the %zu its head says",
           k->table_name, r, pt.rlen[r], want);
      owner_status = status = PART_FAILED;
      break;
    }
    if (a[r].flags & COUNTS)
      a[r].counts = part + HEAD + (size_t)a[r].u * sizeof(int64_t);
    if (a[r].now > now_max) now_max = a[r].now;
    total += (size_t)a[r].u;
  }
  const size_t row_bytes = (size_t)dim * sizeof(float);
  rows = malloc((total ? total : 1) * (row_bytes ? row_bytes : 1));
  defaults = malloc((total ? total : 1) * sizeof *defaults);
  if (!rows || !defaults) {
    fail(ctx, TF_RESOURCE_EXHAUSTED, "dynemb sharded lookup: out of memory");
    owner_status = status = PART_FAILED;
  }
  if (!owner_status) {
    int rc = owner_lookup(t, k, a, n_ranks, total, now_max, rows, defaults);
    if (rc != DYNEMB_OK) {
      fail_engine(ctx, rc, "sharded lookup");
      owner_status = status = PART_FAILED;
    }
  }
  if (k->replicated) { /* every rank looked up every rank's keys alike */
    if (status) goto done;
    if (bad >= 0) {
      fail_peer(ctx, k, "sharded lookup", bad);
      goto done;
    }
    const float *mine = rows + a[me].first * (size_t)dim;
    const uint32_t *m = defaults + a[me].first;
    int any_default = 0;
    for (size_t j = 0; j < rt.n_unique; j++) any_default |= m[j] > 0;
    if (any_default && !(def = default_row(ctx, t, keys, row_bytes)))
      goto done;
    float *o = TF_TensorData(out);
    TF_Bool *h = TF_TensorData(has);
    for (int64_t i = 0; i < n; i++) {
      size_t g = rt.uniq_of[i];
      memcpy(o + i * dim, rt.occ[i] < m[g] ? def : mine + g * (size_t)dim,
             row_bytes);
      if (k->found) h[i] = rt.occ[i] >= m[g];
    }
    goto done;
  }
  /* Second exchange: one row per unique key goes back to the rank that
   * asked, with the count of its occurrences that read the default. */
  for (int r = 0; r < n_ranks; r++) {
    flags[r] = 0;
    for (int64_t j = 0; !owner_status && j < a[r].u; j++)
      if (defaults[a[r].first + (size_t)j]) flags[r] = DEFAULTS;
  }
  free(send);
  rows_arg ra = {a, flags, row_bytes, (int)owner_status};
  if (!(send = layout(ctx, &pt, n_ranks, HEAD, rows_bytes, &ra,
                      "sharded lookup"))) {
    exchange_failed(c, k, &pt, n_ranks, 1);
    goto done;
  }
  for (int r = 0; r < n_ranks; r++) {
    size_t u = owner_status ? 0 : (size_t)a[r].u;
    int64_t head[4] = {owner_status, dim, (int64_t)u, flags[r]};
    char *part = send + pt.soff[r];
    memcpy(part, head, sizeof head);
    if (!u) continue;
    char *at = part + HEAD;
    if (flags[r] & DEFAULTS) {
      memcpy(at, defaults + a[r].first, u * sizeof(uint32_t));
      at += u * sizeof(uint32_t);
    }
    memcpy(at, rows + a[r].first * (size_t)dim, u * row_bytes);
  }
  if (exchange(ctx, c, k, "sharded lookup", send, pt.soff, pt.slen,
               (void **)&rows_recv, pt.roff, pt.rlen))
    goto done;
  if (status) goto done; /* this rank's own error is reported already */
  if (bad < 0) bad = failed_peer(rows_recv, pt.roff, pt.rlen, n_ranks, me);
  if (bad >= 0) {
    fail_peer(ctx, k, "sharded lookup", bad);
    goto done;
  }
  /* Each part: where its rows and default counts are. */
  const char **row_at = calloc(2 * (size_t)n_ranks, sizeof *row_at);
  const char **def_at = row_at + n_ranks;
  if (!row_at) {
    fail(ctx, TF_RESOURCE_EXHAUSTED, "dynemb sharded lookup: out of memory");
    goto done;
  }
  int any_default = 0;
  for (int r = 0; r < n_ranks; r++) {
    int64_t head[4] = {0, -1, -1, 0};
    const char *part = rows_recv + pt.roff[r];
    if (pt.rlen[r] >= HEAD) memcpy(head, part, sizeof head);
    size_t u = rt.first[r + 1] - rt.first[r];
    size_t want =
        HEAD + (head[3] & DEFAULTS ? u * sizeof(uint32_t) : 0) + u * row_bytes;
    if (head[1] != dim || (size_t)head[2] != u || pt.rlen[r] != want) {
      fail(ctx, TF_FAILED_PRECONDITION,
           "dynemb sharded lookup: table '%s' has dim %lld on rank %d but "
           "%lld on rank %d, or rank %d answered %lld keys for %zu; create "
           "the table with the same configuration on every rank",
           k->table_name, (long long)dim, me, (long long)head[1], r, r,
           (long long)head[2], u);
      free(row_at);
      goto done;
    }
    def_at[r] = head[3] & DEFAULTS ? part + HEAD : NULL;
    row_at[r] = part + HEAD + (def_at[r] ? u * sizeof(uint32_t) : 0);
    any_default |= def_at[r] != NULL;
  }
  if (any_default && !(def = default_row(ctx, t, keys, row_bytes))) {
    free(row_at);
    goto done;
  }
  float *o = TF_TensorData(out);
  TF_Bool *h = TF_TensorData(has);
  for (int64_t i = 0; i < n; i++) {
    size_t g = rt.uniq_of[i];
    int r = rt.uowner[g];
    size_t j = g - rt.first[r];
    uint32_t m = 0;
    if (def_at[r]) memcpy(&m, def_at[r] + j * sizeof m, sizeof m);
    memcpy(o + i * dim,
           rt.occ[i] < m ? (const char *)def : row_at[r] + j * row_bytes,
           row_bytes);
    if (k->found) h[i] = rt.occ[i] >= m;
  }
  free(row_at);
done:
  free(pt.soff);
  free(send);
  free(recv);
  free(rows_recv);
  free(rows);
  free(defaults);
  free(def);
  free(a);
  free(flags);
  dynemb_route_free(&rt);
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

/* Gradient part: {status, dim} then u unique keys and their u gradient
 * rows, each the sum of the key's occurrences in this rank's batch. */
enum { GRAD_HEAD = 2 * sizeof(int64_t) };

typedef struct grads_arg {
  const dynemb_route *rt;
  size_t pair;
  const sstate *k;
} grads_arg;

static size_t grads_bytes(const void *p, int r) {
  const grads_arg *x = p;
  int o = group_of(x->k, r);
  return (x->rt->first[o + 1] - x->rt->first[o]) * x->pair;
}

static void apply_compute(void *p, TF_OpKernelContext *ctx) {
  const sstate *k = p;
  TF_Tensor *keyt = NULL, *grads = NULL, *lrt = NULL;
  dynemb_table *t = NULL;
  int64_t *okeys = NULL;
  char *send = NULL, *recv = NULL;
  float *ograds = NULL, *sums = NULL;
  dynemb_route rt = {0};
  parts pt = {0};
  dynemb_comm *c = world(ctx, k, "sharded apply");
  if (!c) return;
  const int n_ranks = dynemb_comm_size(c), me = dynemb_comm_rank(c);
  int64_t status = 0, dim = 0, n = 0;
  float lr = 0;
  if (parts_alloc(&pt, n_ranks)) {
    fail(ctx, TF_RESOURCE_EXHAUSTED, "dynemb sharded apply: out of memory");
    return;
  }
  if (!(keyt = input(ctx, "keys")) || !(grads = input(ctx, "grads")) ||
      !(lrt = input(ctx, "learning_rate"))) {
    status = PART_FAILED;
  } else if (dynemb_table_find(k->table_name, &t) != DYNEMB_OK) {
    fail(ctx, TF_NOT_FOUND,
         "dynemb sharded apply: table '%s' is not registered in this process; "
         "create it on every rank before running the graph",
         k->table_name);
    status = PART_FAILED;
  } else {
    dim = dynemb_table_dim(t);
    n = TF_TensorElementCount(keyt);
    if (TF_TensorType(keyt) != TF_INT64 ||
        TF_TensorElementCount(grads) != n * dim ||
        TF_TensorElementCount(lrt) != 1) {
      fail(ctx, TF_INVALID_ARGUMENT,
           "dynemb sharded apply: table '%s' (dim %lld): got %lld gradient "
           "values for %lld int64 keys and a learning rate of %lld values; "
           "expected keys*dim values and a scalar rate",
           k->table_name, (long long)dim,
           (long long)TF_TensorElementCount(grads), (long long)n,
           (long long)TF_TensorElementCount(lrt));
      status = PART_FAILED;
    } else {
      lr = *(const float *)TF_TensorData(lrt);
    }
  }
  if (!status &&
      dynemb_route_build(&rt, TF_TensorData(keyt), (size_t)n,
                         k->replicated ? 1 : n_ranks)) {
    fail(ctx, TF_RESOURCE_EXHAUSTED, "dynemb sharded apply: out of memory");
    status = PART_FAILED;
  }
  const size_t row_bytes = (size_t)dim * sizeof(float);
  if (!status) { /* a key's rows summed here, in the batch's order */
    sums = calloc(rt.n_unique ? rt.n_unique * (size_t)dim : 1, sizeof *sums);
    if (!sums) {
      fail(ctx, TF_RESOURCE_EXHAUSTED, "dynemb sharded apply: out of memory");
      status = PART_FAILED;
    }
  }
  if (!status) {
    const float *g = TF_TensorData(grads);
    for (int64_t i = 0; i < n; i++) {
      float *s = sums + rt.uniq_of[i] * (size_t)dim;
      for (int64_t d = 0; d < dim; d++) s[d] += g[i * dim + d];
    }
  }
  grads_arg ga = {&rt, sizeof(int64_t) + row_bytes, k};
  if (!(send = layout(ctx, &pt, n_ranks, GRAD_HEAD, status ? NULL : grads_bytes,
                      &ga, "sharded apply"))) {
    exchange_failed(c, k, &pt, n_ranks, 1);
    goto done;
  }
  for (int r = 0; r < n_ranks; r++) {
    int64_t head[2] = {status, dim};
    char *part = send + pt.soff[r];
    memcpy(part, head, sizeof head);
    int o = group_of(k, r);
    size_t u = status ? 0 : rt.first[o + 1] - rt.first[o];
    if (!u) continue;
    memcpy(part + GRAD_HEAD, rt.ukey + rt.first[o], u * sizeof(int64_t));
    memcpy(part + GRAD_HEAD + u * sizeof(int64_t),
           sums + rt.first[o] * (size_t)dim, u * row_bytes);
  }
  if (exchange(ctx, c, k, "sharded apply", send, pt.soff, pt.slen,
               (void **)&recv, pt.roff, pt.rlen))
    goto done;
  if (status) goto done;
  int bad = failed_peer(recv, pt.roff, pt.rlen, n_ranks, me);
  if (bad >= 0) {
    fail_peer(ctx, k, "sharded apply", bad);
    goto done;
  }
  size_t n_owned = 0;
  const size_t pair = sizeof(int64_t) + row_bytes;
  for (int r = 0; r < n_ranks; r++) {
    int64_t head[2] = {0, -1};
    if (pt.rlen[r] >= GRAD_HEAD) memcpy(head, recv + pt.roff[r], sizeof head);
    size_t len = pt.rlen[r] >= GRAD_HEAD ? pt.rlen[r] - GRAD_HEAD : 1;
    if (head[1] != dim || len % pair) {
      fail(ctx, TF_FAILED_PRECONDITION,
           "dynemb sharded apply: table '%s' has dim %lld on rank %d but %lld "
           "on rank %d; create it with the same configuration on every rank",
           k->table_name, (long long)dim, me, (long long)head[1], r);
      goto done;
    }
    n_owned += len / pair;
  }
  okeys = malloc((n_owned ? n_owned : 1) * sizeof *okeys);
  ograds = malloc((n_owned ? n_owned : 1) * (row_bytes ? row_bytes : 1));
  if (!okeys || !ograds) {
    fail(ctx, TF_RESOURCE_EXHAUSTED, "dynemb sharded apply: out of memory");
    goto done;
  }
  size_t filled = 0;
  for (int r = 0; r < n_ranks; r++) { /* every rank's rows, in rank order */
    size_t m = (pt.rlen[r] - GRAD_HEAD) / pair;
    const char *part = recv + pt.roff[r] + GRAD_HEAD;
    memcpy(okeys + filled, part, m * sizeof(int64_t));
    memcpy(ograds + filled * (size_t)dim, part + m * sizeof(int64_t),
           m * row_bytes);
    filled += m;
  }
  if (k->average) {
    const float inv = 1.0f / (float)n_ranks;
    for (size_t i = 0; i < n_owned * (size_t)dim; i++) ograds[i] *= inv;
  }
  /* Called with no keys too: a step counts for every rank's table (lazy
   * Adam's bias correction reads the table's step count). */
  dynemb_apply_stats s = {0};
  int rc = dynemb_apply(t, okeys, n_owned, ograds, lr, NULL, &s);
  if (rc != DYNEMB_OK) {
    fail_engine(ctx, rc, "sharded apply");
    goto done;
  }
  set_scalar_output(ctx, 0, (int64_t)s.applied);
done:
  free(pt.soff);
  free(send);
  free(recv);
  free(okeys);
  free(ograds);
  free(sums);
  dynemb_route_free(&rt);
  if (keyt) TF_DeleteTensor(keyt);
  if (grads) TF_DeleteTensor(grads);
  if (lrt) TF_DeleteTensor(lrt);
  dynemb_table_release(t);
}

/* ------------------------------------------------------------------------ */
/* DynembAllreduce                                                           */
/* ------------------------------------------------------------------------ */

/* Both parts: status, element count of the whole (all tensors), values. */
enum { REDUCE_HEAD = 2 * sizeof(int64_t) };

/* The k-th of n ranks' chunk of `total` elements: [lo, hi). */
static void chunk(int64_t total, int n, int r, int64_t *lo, int64_t *hi) {
  *lo = total * r / n;
  *hi = total * (r + 1) / n;
}

/* acc[i] = acc[i] (op) v[i] for n elements of one type; integers add and
 * multiply as unsigned (wrapping, as TensorFlow's integer ops do, instead of
 * overflowing); max and min keep a NaN. */
#define COMBINE(T, U)                                                      \
  do {                                                                     \
    T *a = acc;                                                            \
    const T *b = v;                                                        \
    for (size_t i = 0; i < n; i++) switch (red) {                          \
        case REDUCE_PROD: a[i] = (T)((U)a[i] * (U)b[i]); break;            \
        case REDUCE_MAX:                                                   \
          if (b[i] > a[i] || b[i] != b[i]) a[i] = b[i];                    \
          break;                                                           \
        case REDUCE_MIN:                                                   \
          if (b[i] < a[i] || b[i] != b[i]) a[i] = b[i];                    \
          break;                                                           \
        default: a[i] = (T)((U)a[i] + (U)b[i]); break;                     \
      }                                                                    \
  } while (0)

static void combine(TF_DataType type, int red, void *acc, const void *v,
                    size_t n) {
  switch (type) {
  case TF_DOUBLE: COMBINE(double, double); break;
  case TF_INT32: COMBINE(int32_t, uint32_t); break;
  case TF_INT64: COMBINE(int64_t, uint64_t); break;
  default: COMBINE(float, float); break;
  }
}
#undef COMBINE

/* acc[i] /= ranks, for the mean of a floating type. */
static void divide(TF_DataType type, void *acc, size_t n, int ranks) {
  if (type == TF_DOUBLE)
    for (size_t i = 0; i < n; i++) ((double *)acc)[i] /= (double)ranks;
  else
    for (size_t i = 0; i < n; i++) ((float *)acc)[i] /= (float)ranks;
}

static void allreduce_compute(void *p, TF_OpKernelContext *ctx) {
  const sstate *k = p;
  dynemb_comm *c = world(ctx, k, "allreduce");
  if (!c) return;
  const int n_ranks = dynemb_comm_size(c), me = dynemb_comm_rank(c);
  TF_Status *st = TF_NewStatus();
  TF_InputRange_Args range = {.struct_size = TF_InputRange_Args_STRUCT_SIZE,
                              .priv = NULL,
                              .status = st};
  TF_InputRange(ctx, "tensors", &range);
  const int n_in = TF_GetCode(st) == TF_OK ? range.stop - range.start : 0;
  TF_Tensor **in = calloc((size_t)(n_in ? n_in : 1), sizeof *in);
  int64_t *first = calloc((size_t)n_in + 1, sizeof *first);
  char *flat = NULL, *mine = NULL, *part = NULL;
  char *send = NULL, *recv = NULL, *gathered = NULL;
  parts pt = {0};
  int64_t status = 0, total = 0;
  TF_DataType type = TF_FLOAT;
  size_t es = sizeof(float);
  if (TF_GetCode(st) != TF_OK || !in || !first || parts_alloc(&pt, n_ranks)) {
    fail(ctx, TF_INTERNAL, "dynemb allreduce: cannot read its inputs");
    status = PART_FAILED;
  }
  for (int i = 0; !status && i < n_in; i++) {
    TF_GetInput(ctx, range.start + i, &in[i], st);
    if (TF_GetCode(st) != TF_OK) {
      fail(ctx, TF_INTERNAL, "dynemb allreduce: cannot read tensor %d", i);
      status = PART_FAILED;
      break;
    }
    if (i == 0) { /* (the op's definition gives all tensors one type) */
      type = TF_TensorType(in[0]);
      es = TF_DataTypeSize(type);
    }
    first[i + 1] = first[i] + TF_TensorElementCount(in[i]);
  }
  if (!status && k->reduction == REDUCE_MEAN && type != TF_FLOAT &&
      type != TF_DOUBLE) {
    fail(ctx, TF_INVALID_ARGUMENT,
         "dynemb allreduce: 'mean' of integer tensors; reduce with 'sum' and "
         "divide, or cast them to a float type first");
    status = PART_FAILED;
  }
  if (!status) total = first[n_in];
  if (!pt.soff) goto done; /* (the peers time out naming this rank) */
  if (!status && !(flat = malloc((size_t)(total ? total : 1) * es))) {
    fail(ctx, TF_RESOURCE_EXHAUSTED, "dynemb allreduce: out of memory");
    status = PART_FAILED;
  }
  for (int i = 0; !status && i < n_in; i++)
    memcpy(flat + (size_t)first[i] * es, TF_TensorData(in[i]),
           (size_t)(first[i + 1] - first[i]) * es);
  /* Reduce-scatter: rank r gets everyone's chunk r. */
  size_t bytes = 0;
  for (int r = 0; r < n_ranks; r++) {
    int64_t lo, hi;
    chunk(total, n_ranks, r, &lo, &hi);
    pt.soff[r] = bytes;
    pt.slen[r] = REDUCE_HEAD + (status ? 0 : (size_t)(hi - lo) * es);
    bytes += pt.slen[r];
  }
  if (!(send = malloc(bytes))) {
    fail(ctx, TF_RESOURCE_EXHAUSTED, "dynemb allreduce: out of memory");
    exchange_failed(c, k, &pt, n_ranks, 2);
    goto done;
  }
  for (int r = 0; r < n_ranks; r++) {
    /* The head carries the type in its high bits so that ranks reducing
     * different types fail as ranks reducing different sizes do. */
    int64_t head[2] = {status, total | ((int64_t)type << 48)}, lo, hi;
    memcpy(send + pt.soff[r], head, sizeof head);
    chunk(total, n_ranks, r, &lo, &hi);
    if (!status && hi > lo)
      memcpy(send + pt.soff[r] + REDUCE_HEAD, flat + (size_t)lo * es,
             (size_t)(hi - lo) * es);
  }
  if (exchange(ctx, c, k, "allreduce", send, pt.soff, pt.slen, (void **)&recv,
               pt.roff, pt.rlen)) {
    exchange_failed(c, k, &pt, n_ranks, 1);
    goto done;
  }
  int bad = failed_peer(recv, pt.roff, pt.rlen, n_ranks, me);
  int64_t lo, hi;
  chunk(total, n_ranks, me, &lo, &hi);
  const size_t mine_n = (size_t)(hi - lo);
  int64_t own_status = status || bad >= 0 ? PART_FAILED : 0;
  const int64_t want = total | ((int64_t)type << 48);
  for (int r = 0; !own_status && r < n_ranks; r++) {
    int64_t head[2] = {0, -1};
    if (pt.rlen[r] >= REDUCE_HEAD) memcpy(head, recv + pt.roff[r], sizeof head);
    if (head[1] != want) {
      fail(ctx, TF_FAILED_PRECONDITION,
           "dynemb allreduce: rank %d reduces %lld values of type %d, rank %d "
           "%lld of type %d; every rank must reduce the same tensors (same "
           "model, same shapes and dtypes)",
           me, (long long)total, (int)type, r,
           (long long)(head[1] & ((INT64_C(1) << 48) - 1)),
           (int)(head[1] >> 48));
      own_status = status = PART_FAILED;
    }
  }
  mine = calloc(mine_n ? mine_n : 1, es);
  part = malloc((mine_n ? mine_n : 1) * es);
  if (!mine || !part) {
    fail(ctx, TF_RESOURCE_EXHAUSTED, "dynemb allreduce: out of memory");
    exchange_failed(c, k, &pt, n_ranks, 1);
    goto done;
  }
  if (!own_status) {
    /* In rank order, the same on every rank: every rank gets the same
     * bits. (Parts are copied out first: they need not be aligned.) */
    for (int r = 0; r < n_ranks; r++) {
      if (k->reduction == REDUCE_BROADCAST && r != 0) continue;
      memcpy(r == 0 ? mine : part, recv + pt.roff[r] + REDUCE_HEAD,
             mine_n * es);
      if (r > 0) combine(type, k->reduction, mine, part, mine_n);
    }
    if (k->reduction == REDUCE_MEAN) divide(type, mine, mine_n, n_ranks);
  }
  /* All-gather: every rank gets every reduced chunk. */
  free(send);
  const size_t gbytes = REDUCE_HEAD + (own_status ? 0 : mine_n * es);
  if (!(send = malloc(gbytes))) {
    fail(ctx, TF_RESOURCE_EXHAUSTED, "dynemb allreduce: out of memory");
    exchange_failed(c, k, &pt, n_ranks, 1);
    goto done;
  }
  int64_t head[2] = {own_status, total};
  memcpy(send, head, sizeof head);
  if (!own_status) memcpy(send + REDUCE_HEAD, mine, mine_n * es);
  for (int r = 0; r < n_ranks; r++) {
    pt.soff[r] = 0;
    pt.slen[r] = gbytes;
  }
  if (exchange(ctx, c, k, "allreduce", send, pt.soff, pt.slen,
               (void **)&gathered, pt.roff, pt.rlen))
    goto done;
  if (status) goto done;
  if (bad < 0) bad = failed_peer(gathered, pt.roff, pt.rlen, n_ranks, me);
  if (bad >= 0) {
    fail(ctx, TF_ABORTED,
         "dynemb allreduce: rank %d failed this step (its own error says why)",
         bad);
    goto done;
  }
  for (int r = 0; r < n_ranks; r++) {
    int64_t rlo, rhi;
    chunk(total, n_ranks, r, &rlo, &rhi);
    if (pt.rlen[r] != REDUCE_HEAD + (size_t)(rhi - rlo) * es) {
      fail(ctx, TF_INTERNAL,
           "dynemb allreduce: rank %d sent a chunk of the "
           "wrong size",
           r);
      goto done;
    }
    if (rhi > rlo)
      memcpy(flat + (size_t)rlo * es, gathered + pt.roff[r] + REDUCE_HEAD,
             (size_t)(rhi - rlo) * es);
  }
  for (int i = 0; i < n_in; i++) {
    int nd = TF_NumDims(in[i]);
    int64_t dims[32];
    if (nd > 32) {
      fail(ctx, TF_INVALID_ARGUMENT,
           "dynemb allreduce: tensor %d has rank %d; "
           "at most 32",
           i, nd);
      goto done;
    }
    for (int d = 0; d < nd; d++) dims[d] = TF_Dim(in[i], d);
    TF_Tensor *o = output(ctx, i, type, dims, nd, es);
    if (!o) goto done;
    memcpy(TF_TensorData(o), flat + (size_t)first[i] * es,
           (size_t)(first[i + 1] - first[i]) * es);
    TF_DeleteTensor(o);
  }
done:
  for (int i = 0; in && i < n_in; i++)
    if (in[i]) TF_DeleteTensor(in[i]);
  free(in);
  free(first);
  free(flat);
  free(mine);
  free(part);
  free(send);
  free(recv);
  free(gathered);
  free(pt.soff);
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
