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
 *       the largest `now` of all ranks, and the rows come back.
 *   DynembShardedApply keys, grads, learning_rate -> applied (this rank's):
 *       each (key, gradient row) goes to its owner, which applies every
 *       rank's rows in one dynemb_apply (so each key is updated once per
 *       step with the gradient summed over ranks, as for the global batch);
 *       `average` divides the rows by the rank count first.
 *   DynembAllreduce tensors (float) -> reduced: the elementwise sum, mean
 *       or rank 0's values (broadcast) on every rank: a reduce-scatter and
 *       an all-gather, summing in rank order so every rank gets the same
 *       bits.
 *
 * Every part a rank sends begins with a status word: a rank whose kernel
 * failed still takes part in the exchange with a nonzero status, so its
 * peers fail at once with an error naming it instead of waiting for the
 * exchange's deadline.
 */
#include "kernel_util.h"

#include "dynemb_comm.h"

typedef struct sstate {
  char *table_name;   /* lookup, apply */
  int is_train;       /* lookup */
  int64_t send_count; /* lookup: unique ids per owner at most (0: any) */
  int average;        /* apply */
  int64_t channel, ranks;
  int reduction; /* allreduce */
} sstate;

enum { REDUCE_SUM, REDUCE_MEAN, REDUCE_BROADCAST };

static void delete_sstate(void *p) {
  sstate *k = p;
  if (k)
    free(k->table_name);
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
    if (!r)
      goto fail;
    k->reduction = strcmp(r, "mean") == 0        ? REDUCE_MEAN
                   : strcmp(r, "broadcast") == 0 ? REDUCE_BROADCAST
                                                 : REDUCE_SUM;
    int known =
        !strcmp(r, "sum") || !strcmp(r, "mean") || !strcmp(r, "broadcast");
    if (!known)
      TF_SetStatus(st, TF_INVALID_ARGUMENT,
                   "dynemb allreduce: reduction must be 'sum', 'mean' or "
                   "'broadcast'");
    free(r);
    if (!known)
      goto fail;
  } else {
    k->table_name = get_string_attr(c, "table_name", st);
    if (!k->table_name)
      goto fail;
    if (strcmp(what, "lookup") == 0 &&
        (get_bool(c, "is_train", &k->is_train, st) ||
         get_int(c, "send_count", &k->send_count, st)))
      goto fail;
    if (strcmp(what, "apply") == 0 && get_bool(c, "average", &k->average, st))
      goto fail;
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
  return c;
}

/* One exchange on the kernel's channel; on failure fails the kernel. */
static int exchange(TF_OpKernelContext *ctx, dynemb_comm *c, const sstate *k,
                    const char *what, const void *send, const size_t *soff,
                    const size_t *slen, void **recv, size_t *roff,
                    size_t *rlen) {
  char err[768];
  if (dynemb_comm_alltoallv(c, (uint32_t)k->channel, send, soff, slen, recv,
                            roff, rlen, err, sizeof err) == 0)
    return 0;
  fail(ctx, TF_UNAVAILABLE, "dynemb %s%s%s%s: %s", what,
       k->table_name ? " of table '" : "", k->table_name ? k->table_name : "",
       k->table_name ? "'" : "", err);
  return -1;
}

/* Status words: 0 is fine; a failing rank sends this. */
#define PART_FAILED 1

/* The first rank p (not `me`) whose part begins with a nonzero status, or
 * -1. Parts shorter than a status word count as failed. */
static int failed_peer(const char *recv, const size_t *roff, const size_t *rlen,
                       int n, int me) {
  for (int p = 0; p < n; p++) {
    if (p == me)
      continue;
    int64_t s = PART_FAILED;
    if (rlen[p] >= sizeof s)
      memcpy(&s, recv + roff[p], sizeof s);
    if (s != 0)
      return p;
  }
  return -1;
}

static void fail_peer(TF_OpKernelContext *ctx, const sstate *k, const char *op,
                      int p) {
  fail(ctx, TF_ABORTED,
       "dynemb %s of table '%s': rank %d failed this step (its own error "
       "says why)",
       op, k->table_name ? k->table_name : "-", p);
}

/* Where each of n keys goes: dest[i] (its owner), at[i] (its place among
 * the keys sent to that owner), count[p] keys for owner p. */
static void route(const int64_t *keys, int64_t n, int ranks, int *dest,
                  int64_t *at, size_t *count) {
  for (int p = 0; p < ranks; p++)
    count[p] = 0;
  for (int64_t i = 0; i < n; i++) {
    int d = (int)dynemb_key_shard(keys[i], (uint32_t)ranks);
    dest[i] = d;
    at[i] = (int64_t)count[d]++;
  }
}

static int cmp_i64(const void *a, const void *b) {
  int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
  return (x > y) - (x < y);
}

/* mxRec's send_count (static-shape mode): the unique ids this rank sends
 * to each owner must fit it. 0 when they do; otherwise fails the kernel
 * naming the owner, the count and the fix. */
static int check_send_count(TF_OpKernelContext *ctx, const sstate *k,
                            const int64_t *keys, int64_t n, const int *dest,
                            int ranks) {
  if (k->send_count <= 0 || n == 0)
    return 0;
  int64_t *sorted = malloc((size_t)n * sizeof *sorted);
  if (!sorted) {
    fail(ctx, TF_RESOURCE_EXHAUSTED, "dynemb sharded lookup: out of memory");
    return -1;
  }
  int rc = 0;
  for (int r = 0; r < ranks && !rc; r++) {
    int64_t m = 0;
    for (int64_t i = 0; i < n; i++)
      if (dest[i] == r)
        sorted[m++] = keys[i];
    qsort(sorted, (size_t)m, sizeof *sorted, cmp_i64);
    int64_t unique = 0;
    for (int64_t i = 0; i < m; i++)
      unique += i == 0 || sorted[i] != sorted[i - 1];
    if (unique > k->send_count) {
      fail(
          ctx, TF_INVALID_ARGUMENT,
          "dynemb sharded lookup: table '%s': this batch sends %lld unique ids "
          "to "
          "rank %d, above send_count = %lld; raise send_count to at least %lld "
          "(static-shape mode, init(use_dynamic=False))",
          k->table_name, (long long)unique, r, (long long)k->send_count,
          (long long)unique);
      rc = -1;
    }
  }
  free(sorted);
  return rc;
}

/* Per-rank arrays of the exchanges (offsets and lengths, sent and
 * received), one allocation. */
typedef struct parts {
  size_t *soff, *slen, *roff, *rlen, *count;
} parts;

static int parts_alloc(parts *pt, int n) {
  size_t *a = calloc((size_t)n * 5, sizeof *a);
  if (!a)
    return -1;
  *pt = (parts){a, a + n, a + 2 * n, a + 3 * n, a + 4 * n};
  return 0;
}

/* ------------------------------------------------------------------------ */
/* DynembShardedLookup                                                       */
/* ------------------------------------------------------------------------ */

/* Keys part: status, now, keys. Rows part: status, dim, rows. */
enum { KEYS_HEAD = 2 * sizeof(int64_t), ROWS_HEAD = 2 * sizeof(int64_t) };

static void lookup_compute(void *p, TF_OpKernelContext *ctx) {
  const sstate *k = p;
  TF_Tensor *ids = NULL, *nowt = NULL, *out = NULL;
  dynemb_table *t = NULL;
  int64_t *wide = NULL, *at = NULL, *owned = NULL;
  int *dest = NULL;
  char *send = NULL, *recv = NULL, *rows_recv = NULL;
  float *rows = NULL;
  parts pt = {0};
  dynemb_comm *c = world(ctx, k, "sharded lookup");
  if (!c)
    return;
  const int n_ranks = dynemb_comm_size(c), me = dynemb_comm_rank(c);
  int64_t status = 0, now = 0, dim = 0, n = 0;
  const int64_t *keys = NULL;
  if (parts_alloc(&pt, n_ranks)) {
    fail(ctx, TF_RESOURCE_EXHAUSTED, "dynemb sharded lookup: out of memory");
    return;
  }
  /* Local failures (reported by the kernel already) still take part in
   * both exchanges, with a failed status. */
  if (!(ids = input(ctx, "ids")) || !(nowt = input(ctx, "now")) ||
      scalar_i64(ctx, nowt, "sharded lookup", "now", &now) ||
      dynemb_table_find(k->table_name, &t) != DYNEMB_OK) {
    if (ids && nowt && !t)
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
    const int64_t dims[2] = {n, dim};
    if (!(out = output(ctx, 0, TF_FLOAT, dims, 2, sizeof(float))))
      status = PART_FAILED;
  }
  if (!status && n > 0 &&
      !(keys =
            ids_as_int64(ctx, k->table_name, ids, n, "sharded lookup", &wide)))
    status = PART_FAILED;
  if (!status) {
    dest = malloc((size_t)(n ? n : 1) * sizeof *dest);
    at = malloc((size_t)(n ? n : 1) * sizeof *at);
    if (!dest || !at) {
      fail(ctx, TF_RESOURCE_EXHAUSTED, "dynemb sharded lookup: out of memory");
      status = PART_FAILED;
    }
  }
  if (!status)
    route(keys, n, n_ranks, dest, at, pt.count);
  if (!status && check_send_count(ctx, k, keys, n, dest, n_ranks))
    status = PART_FAILED;
  /* First exchange: each owner gets its keys (and everyone's clock). */
  size_t total = 0;
  for (int r = 0; r < n_ranks; r++) {
    pt.soff[r] = total;
    pt.slen[r] = KEYS_HEAD + (status ? 0 : pt.count[r] * sizeof(int64_t));
    total += pt.slen[r];
  }
  if (!(send = malloc(total))) {
    fail(ctx, TF_RESOURCE_EXHAUSTED, "dynemb sharded lookup: out of memory");
    goto done; /* (the peers time out naming this rank) */
  }
  for (int r = 0; r < n_ranks; r++) {
    int64_t head[2] = {status, now};
    memcpy(send + pt.soff[r], head, sizeof head);
  }
  if (!status)
    for (int64_t i = 0; i < n; i++)
      memcpy(send + pt.soff[dest[i]] + KEYS_HEAD + at[i] * sizeof(int64_t),
             &keys[i], sizeof(int64_t));
  if (exchange(ctx, c, k, "sharded lookup", send, pt.soff, pt.slen,
               (void **)&recv, pt.roff, pt.rlen))
    goto done;
  int bad = failed_peer(recv, pt.roff, pt.rlen, n_ranks, me);
  /* This rank as owner: every rank's keys in rank order. */
  size_t n_owned = 0;
  int64_t now_max = 0;
  for (int r = 0; r < n_ranks; r++) {
    size_t len = pt.rlen[r] >= KEYS_HEAD ? pt.rlen[r] - KEYS_HEAD : 0;
    n_owned += len / sizeof(int64_t);
    int64_t their_now = 0;
    if (pt.rlen[r] >= KEYS_HEAD)
      memcpy(&their_now, recv + pt.roff[r] + sizeof(int64_t), sizeof their_now);
    if (their_now > now_max)
      now_max = their_now;
  }
  size_t *from = calloc((size_t)n_ranks + 1, sizeof *from);
  owned = malloc((n_owned ? n_owned : 1) * sizeof *owned);
  rows =
      malloc((n_owned ? n_owned : 1) * (size_t)(dim ? dim : 1) * sizeof *rows);
  if (!from || !owned || !rows) {
    free(from);
    fail(ctx, TF_RESOURCE_EXHAUSTED, "dynemb sharded lookup: out of memory");
    goto done;
  }
  for (int r = 0; r < n_ranks; r++) {
    size_t len = pt.rlen[r] >= KEYS_HEAD ? pt.rlen[r] - KEYS_HEAD : 0;
    if (len)
      memcpy(owned + from[r], recv + pt.roff[r] + KEYS_HEAD, len);
    from[r + 1] = from[r] + len / sizeof(int64_t);
  }
  int64_t owner_status = status || bad >= 0 ? PART_FAILED : 0;
  if (!owner_status) { /* (no keys too: as one process, it stamps the clock) */
    int rc = dynemb_lookup(
        t, owned, n_owned,
        k->is_train ? DYNEMB_LOOKUP_TRAIN : DYNEMB_LOOKUP_EVAL, now_max, rows);
    if (rc != DYNEMB_OK) {
      fail_engine(ctx, rc, "sharded lookup");
      owner_status = status = PART_FAILED;
    }
  }
  /* Second exchange: the rows go back to the ranks that asked. */
  free(send);
  total = 0;
  size_t row_bytes = (size_t)dim * sizeof(float);
  for (int r = 0; r < n_ranks; r++) {
    pt.soff[r] = total;
    pt.slen[r] =
        ROWS_HEAD + (owner_status ? 0 : (from[r + 1] - from[r]) * row_bytes);
    total += pt.slen[r];
  }
  if (!(send = malloc(total))) {
    free(from);
    fail(ctx, TF_RESOURCE_EXHAUSTED, "dynemb sharded lookup: out of memory");
    goto done;
  }
  for (int r = 0; r < n_ranks; r++) {
    int64_t head[2] = {owner_status, dim};
    memcpy(send + pt.soff[r], head, sizeof head);
    if (!owner_status && from[r + 1] > from[r])
      memcpy(send + pt.soff[r] + ROWS_HEAD, rows + from[r] * (size_t)dim,
             (from[r + 1] - from[r]) * row_bytes);
  }
  free(from);
  if (exchange(ctx, c, k, "sharded lookup", send, pt.soff, pt.slen,
               (void **)&rows_recv, pt.roff, pt.rlen))
    goto done;
  if (status)
    goto done; /* this rank's own error is reported already */
  if (bad < 0)
    bad = failed_peer(rows_recv, pt.roff, pt.rlen, n_ranks, me);
  if (bad >= 0) {
    fail_peer(ctx, k, "sharded lookup", bad);
    goto done;
  }
  for (int r = 0; r < n_ranks; r++) {
    int64_t head[2];
    memcpy(head, rows_recv + pt.roff[r], sizeof head);
    if (head[1] != dim || pt.rlen[r] != ROWS_HEAD + pt.count[r] * row_bytes) {
      fail(ctx, TF_FAILED_PRECONDITION,
           "dynemb sharded lookup: table '%s' has dim %lld on rank %d but "
           "%lld on rank %d; create it with the same configuration on every "
           "rank",
           k->table_name, (long long)dim, me, (long long)head[1], r);
      goto done;
    }
  }
  float *o = TF_TensorData(out);
  for (int64_t i = 0; i < n; i++)
    memcpy(o + i * dim,
           rows_recv + pt.roff[dest[i]] + ROWS_HEAD + at[i] * row_bytes,
           row_bytes);
done:
  free(pt.soff);
  free(send);
  free(recv);
  free(rows_recv);
  free(rows);
  free(owned);
  free(dest);
  free(at);
  free(wide);
  if (out)
    TF_DeleteTensor(out);
  if (ids)
    TF_DeleteTensor(ids);
  if (nowt)
    TF_DeleteTensor(nowt);
  dynemb_table_release(t);
}

/* ------------------------------------------------------------------------ */
/* DynembShardedApply                                                        */
/* ------------------------------------------------------------------------ */

/* Gradient part: status, dim, keys, then their rows. */
enum { GRAD_HEAD = 2 * sizeof(int64_t) };

static void apply_compute(void *p, TF_OpKernelContext *ctx) {
  const sstate *k = p;
  TF_Tensor *keyt = NULL, *grads = NULL, *lrt = NULL;
  dynemb_table *t = NULL;
  int64_t *at = NULL, *okeys = NULL;
  int *dest = NULL;
  char *send = NULL, *recv = NULL;
  float *ograds = NULL;
  parts pt = {0};
  dynemb_comm *c = world(ctx, k, "sharded apply");
  if (!c)
    return;
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
  if (!status) {
    dest = malloc((size_t)(n ? n : 1) * sizeof *dest);
    at = malloc((size_t)(n ? n : 1) * sizeof *at);
    if (!dest || !at) {
      fail(ctx, TF_RESOURCE_EXHAUSTED, "dynemb sharded apply: out of memory");
      status = PART_FAILED;
    }
  }
  const int64_t *keys = status ? NULL : TF_TensorData(keyt);
  const float *g = status ? NULL : TF_TensorData(grads);
  if (!status)
    route(keys, n, n_ranks, dest, at, pt.count);
  const size_t row_bytes = (size_t)dim * sizeof(float);
  const size_t pair = sizeof(int64_t) + row_bytes;
  size_t total = 0;
  for (int r = 0; r < n_ranks; r++) {
    pt.soff[r] = total;
    pt.slen[r] = GRAD_HEAD + (status ? 0 : pt.count[r] * pair);
    total += pt.slen[r];
  }
  if (!(send = malloc(total))) {
    fail(ctx, TF_RESOURCE_EXHAUSTED, "dynemb sharded apply: out of memory");
    goto done;
  }
  for (int r = 0; r < n_ranks; r++) {
    int64_t head[2] = {status, dim};
    memcpy(send + pt.soff[r], head, sizeof head);
  }
  if (!status)
    for (int64_t i = 0; i < n; i++) {
      char *part = send + pt.soff[dest[i]] + GRAD_HEAD;
      memcpy(part + at[i] * sizeof(int64_t), &keys[i], sizeof(int64_t));
      memcpy(part + pt.count[dest[i]] * sizeof(int64_t) + at[i] * row_bytes,
             g + i * dim, row_bytes);
    }
  if (exchange(ctx, c, k, "sharded apply", send, pt.soff, pt.slen,
               (void **)&recv, pt.roff, pt.rlen))
    goto done;
  if (status)
    goto done;
  int bad = failed_peer(recv, pt.roff, pt.rlen, n_ranks, me);
  if (bad >= 0) {
    fail_peer(ctx, k, "sharded apply", bad);
    goto done;
  }
  size_t n_owned = 0;
  for (int r = 0; r < n_ranks; r++) {
    int64_t head[2];
    memcpy(head, recv + pt.roff[r], sizeof head);
    size_t len = pt.rlen[r] - GRAD_HEAD;
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
  ograds = malloc((n_owned ? n_owned : 1) * row_bytes);
  if (!okeys || !ograds) {
    fail(ctx, TF_RESOURCE_EXHAUSTED, "dynemb sharded apply: out of memory");
    goto done;
  }
  size_t filled = 0;
  for (int r = 0; r < n_ranks; r++) {
    size_t m = (pt.rlen[r] - GRAD_HEAD) / pair;
    const char *part = recv + pt.roff[r] + GRAD_HEAD;
    memcpy(okeys + filled, part, m * sizeof(int64_t));
    memcpy(ograds + filled * (size_t)dim, part + m * sizeof(int64_t),
           m * row_bytes);
    filled += m;
  }
  if (k->average) {
    const float inv = 1.0f / (float)n_ranks;
    for (size_t i = 0; i < n_owned * (size_t)dim; i++)
      ograds[i] *= inv;
  }
  /* Called with no keys too: a step counts for every rank's table (lazy
   * Adam's bias correction reads the table's step count). */
  dynemb_apply_stats s = {0};
  int rc = dynemb_apply(t, okeys, n_owned, ograds, lr, &s);
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
  free(dest);
  free(at);
  if (keyt)
    TF_DeleteTensor(keyt);
  if (grads)
    TF_DeleteTensor(grads);
  if (lrt)
    TF_DeleteTensor(lrt);
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

static void allreduce_compute(void *p, TF_OpKernelContext *ctx) {
  const sstate *k = p;
  dynemb_comm *c = world(ctx, k, "allreduce");
  if (!c)
    return;
  const int n_ranks = dynemb_comm_size(c), me = dynemb_comm_rank(c);
  TF_Status *st = TF_NewStatus();
  TF_InputRange_Args range = {.struct_size = TF_InputRange_Args_STRUCT_SIZE,
                              .priv = NULL,
                              .status = st};
  TF_InputRange(ctx, "tensors", &range);
  const int n_in = TF_GetCode(st) == TF_OK ? range.stop - range.start : 0;
  TF_Tensor **in = calloc((size_t)(n_in ? n_in : 1), sizeof *in);
  int64_t *first = calloc((size_t)n_in + 1, sizeof *first);
  float *flat = NULL, *mine = NULL;
  char *send = NULL, *recv = NULL, *gathered = NULL;
  parts pt = {0};
  int64_t status = 0, total = 0;
  if (TF_GetCode(st) != TF_OK || !in || !first || parts_alloc(&pt, n_ranks)) {
    fail(ctx, TF_INTERNAL, "dynemb allreduce: cannot read its inputs");
    status = PART_FAILED;
  }
  for (int i = 0; !status && i < n_in; i++) {
    TF_GetInput(ctx, range.start + i, &in[i], st);
    if (TF_GetCode(st) != TF_OK || TF_TensorType(in[i]) != TF_FLOAT) {
      fail(ctx, TF_INVALID_ARGUMENT,
           "dynemb allreduce: tensor %d is not float32; cast it with "
           "tf.cast(t, tf.float32)",
           i);
      status = PART_FAILED;
      break;
    }
    first[i + 1] = first[i] + TF_TensorElementCount(in[i]);
  }
  if (!status)
    total = first[n_in];
  if (!pt.soff)
    goto done; /* (the peers time out naming this rank) */
  if (!status && !(flat = malloc((size_t)(total ? total : 1) * sizeof *flat))) {
    fail(ctx, TF_RESOURCE_EXHAUSTED, "dynemb allreduce: out of memory");
    status = PART_FAILED;
  }
  for (int i = 0; !status && i < n_in; i++)
    memcpy(flat + first[i], TF_TensorData(in[i]),
           (size_t)(first[i + 1] - first[i]) * sizeof *flat);
  /* Reduce-scatter: rank r gets everyone's chunk r. */
  size_t bytes = 0;
  for (int r = 0; r < n_ranks; r++) {
    int64_t lo, hi;
    chunk(total, n_ranks, r, &lo, &hi);
    pt.soff[r] = bytes;
    pt.slen[r] = REDUCE_HEAD + (status ? 0 : (size_t)(hi - lo) * sizeof(float));
    bytes += pt.slen[r];
  }
  if (!(send = malloc(bytes))) {
    fail(ctx, TF_RESOURCE_EXHAUSTED, "dynemb allreduce: out of memory");
    goto done;
  }
  for (int r = 0; r < n_ranks; r++) {
    int64_t head[2] = {status, total}, lo, hi;
    memcpy(send + pt.soff[r], head, sizeof head);
    chunk(total, n_ranks, r, &lo, &hi);
    if (!status && hi > lo)
      memcpy(send + pt.soff[r] + REDUCE_HEAD, flat + lo,
             (size_t)(hi - lo) * sizeof(float));
  }
  if (exchange(ctx, c, k, "allreduce", send, pt.soff, pt.slen, (void **)&recv,
               pt.roff, pt.rlen))
    goto done;
  int bad = failed_peer(recv, pt.roff, pt.rlen, n_ranks, me);
  int64_t lo, hi;
  chunk(total, n_ranks, me, &lo, &hi);
  const size_t mine_n = (size_t)(hi - lo);
  int64_t own_status = status || bad >= 0 ? PART_FAILED : 0;
  for (int r = 0; !own_status && r < n_ranks; r++) {
    int64_t head[2];
    memcpy(head, recv + pt.roff[r], sizeof head);
    if (head[1] != total) {
      fail(ctx, TF_FAILED_PRECONDITION,
           "dynemb allreduce: rank %d reduces %lld values, rank %d %lld; "
           "every rank must reduce the same tensors (same model, same "
           "shapes)",
           me, (long long)total, r, (long long)head[1]);
      own_status = status = PART_FAILED;
    }
  }
  if (!(mine = calloc(mine_n ? mine_n : 1, sizeof *mine))) {
    fail(ctx, TF_RESOURCE_EXHAUSTED, "dynemb allreduce: out of memory");
    goto done;
  }
  if (!own_status) {
    /* In rank order, the same on every rank: every rank gets the same
     * bits. */
    for (int r = 0; r < n_ranks; r++) {
      if (k->reduction == REDUCE_BROADCAST && r != 0)
        continue;
      const float *part = (const float *)(recv + pt.roff[r] + REDUCE_HEAD);
      for (size_t i = 0; i < mine_n; i++) {
        float v;
        memcpy(&v, part + i, sizeof v);
        mine[i] = r == 0 ? v : mine[i] + v;
      }
    }
    if (k->reduction == REDUCE_MEAN)
      for (size_t i = 0; i < mine_n; i++)
        mine[i] /= (float)n_ranks;
  }
  /* All-gather: every rank gets every reduced chunk. */
  free(send);
  const size_t gbytes = REDUCE_HEAD + (own_status ? 0 : mine_n * sizeof(float));
  if (!(send = malloc(gbytes))) {
    fail(ctx, TF_RESOURCE_EXHAUSTED, "dynemb allreduce: out of memory");
    goto done;
  }
  int64_t head[2] = {own_status, total};
  memcpy(send, head, sizeof head);
  if (!own_status)
    memcpy(send + REDUCE_HEAD, mine, mine_n * sizeof(float));
  for (int r = 0; r < n_ranks; r++) {
    pt.soff[r] = 0;
    pt.slen[r] = gbytes;
  }
  if (exchange(ctx, c, k, "allreduce", send, pt.soff, pt.slen,
               (void **)&gathered, pt.roff, pt.rlen))
    goto done;
  if (status)
    goto done;
  if (bad < 0)
    bad = failed_peer(gathered, pt.roff, pt.rlen, n_ranks, me);
  if (bad >= 0) {
    fail(ctx, TF_ABORTED,
         "dynemb allreduce: rank %d failed this step (its own error says why)",
         bad);
    goto done;
  }
  for (int r = 0; r < n_ranks; r++) {
    int64_t rlo, rhi;
    chunk(total, n_ranks, r, &rlo, &rhi);
    if (pt.rlen[r] != REDUCE_HEAD + (size_t)(rhi - rlo) * sizeof(float)) {
      fail(ctx, TF_INTERNAL,
           "dynemb allreduce: rank %d sent a chunk of the "
           "wrong size",
           r);
      goto done;
    }
    if (rhi > rlo)
      memcpy(flat + rlo, gathered + pt.roff[r] + REDUCE_HEAD,
             (size_t)(rhi - rlo) * sizeof(float));
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
    for (int d = 0; d < nd; d++)
      dims[d] = TF_Dim(in[i], d);
    TF_Tensor *o = output(ctx, i, TF_FLOAT, dims, nd, sizeof(float));
    if (!o)
      goto done;
    memcpy(TF_TensorData(o), flat + first[i],
           (size_t)(first[i + 1] - first[i]) * sizeof(float));
    TF_DeleteTensor(o);
  }
done:
  for (int i = 0; in && i < n_in; i++)
    if (in[i])
      TF_DeleteTensor(in[i]);
  free(in);
  free(first);
  free(flat);
  free(mine);
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
           "channel: int", "ranks: int", "Tkeys: {int32, int64}"),
      LIST("ids: Tkeys", "now: int64", "anchor: float"),
      LIST("embeddings: float"), create_lookup, lookup_compute, delete_sstate);
  register_op_kernel(
      "DynembShardedApply",
      LIST("table_name: string", "average: bool = false", "channel: int",
           "ranks: int"),
      LIST("keys: int64", "grads: float", "learning_rate: float"),
      LIST("applied: int64"), create_apply, apply_compute, delete_sstate);
  register_op_kernel("DynembAllreduce",
                     LIST("reduction: string = 'sum'", "channel: int",
                          "ranks: int", "K: int >= 1"),
                     LIST("tensors: K * float"), LIST("reduced: K * float"),
                     create_allreduce, allreduce_compute, delete_sstate);
}
