/*
 * shard_apply.c -- dynemb_shard_apply (shard.h): a batch's gradients
 * applied at their keys' owners, in one exchange on the op's channel.
 *
 * A rank sums the gradient rows of each of its unique keys (in the batch's
 * order) and sends each owner its keys with their sums; the owner applies
 * every rank's rows, in rank order, in one dynemb_apply, so each key is
 * updated once per step with the gradient summed over ranks, as one
 * process would for the global batch. The parts' heads carry the table's
 * dim and optimizer, so ranks whose tables differ fail naming both
 * instead of training different rows.
 */
#include <stdlib.h>
#include <string.h>

#include "route.h"
#include "shard_int.h"

/* Gradient part: {status, dim, optimizer kind, hyper-parameters' print}
 * then u unique keys and their u gradient rows. */
enum { GRAD_HEAD = 4 * sizeof(int64_t) };

typedef struct grads_arg {
  const dynemb_shard_route *rt;
  size_t pair; /* a key and its row */
  int replicated;
} grads_arg;

static size_t grads_bytes(const void *p, int r) {
  const grads_arg *x = p;
  int o = x->replicated ? 0 : r;
  return (x->rt->first[o + 1] - x->rt->first[o]) * x->pair;
}

/* A print of the optimizer's hyper-parameters (FNV-1a over their bits),
 * the learning rate aside: each call passes its own. */
static int64_t hyper_print(const dynemb_optimizer *o) {
  const float v[] = {o->initial_accumulator_value, o->beta1, o->beta2,
                     o->epsilon, o->learning_rate_power, o->l1, o->l2,
                     o->l2_shrinkage};
  uint64_t h = 1469598103934665603ULL;
  const unsigned char *b = (const unsigned char *)v;
  for (size_t i = 0; i < sizeof v; i++) h = (h ^ b[i]) * 1099511628211ULL;
  return (int64_t)(h >> 1);
}

/* The peers' heads against this rank's table: 0, or the error. */
static int check_heads(const dynemb_shard_op *op, const char *recv,
                       const parts *pt, int n, int me, const int64_t mine[4],
                       size_t pair, dynemb_shard_error *err) {
  for (int r = 0; r < n; r++) {
    int64_t head[4] = {0, -1, -1, -1};
    if (pt->rlen[r] >= GRAD_HEAD) memcpy(head, recv + pt->roff[r], sizeof head);
    size_t len = pt->rlen[r] >= GRAD_HEAD ? pt->rlen[r] - GRAD_HEAD : 1;
    if (head[1] != mine[1] || len % pair)
      return shard_fail(
          err, DYNEMB_SHARD_EMISMATCH,
          "dynemb sharded apply: table '%s' has dim %lld on rank %d but %lld "
          "on rank %d; create it with the same configuration on every rank",
          op->table, (long long)mine[1], me, (long long)head[1], r);
    if (head[2] != mine[2])
      return shard_fail(
          err, DYNEMB_SHARD_EMISMATCH,
          "dynemb sharded apply: table '%s' has optimizer %s on rank %d but "
          "%s on rank %d; create it with the same configuration on every "
          "rank",
          op->table, dynemb_optimizer_name((int)mine[2]), me,
          dynemb_optimizer_name((int)head[2]), r);
    if (head[3] != mine[3])
      return shard_fail(
          err, DYNEMB_SHARD_EMISMATCH,
          "dynemb sharded apply: table '%s' has optimizer %s with other "
          "hyper-parameters on rank %d than on rank %d; create it with the "
          "same configuration on every rank",
          op->table, dynemb_optimizer_name((int)mine[2]), r, me);
  }
  return 0;
}

/* The owner's side: every rank's rows, in rank order, in one apply. */
static int owner_apply(const dynemb_shard_op *op, dynemb_table *t,
                       const char *recv, const parts *pt, int n, size_t dim,
                       float lr, size_t *applied, dynemb_shard_error *err) {
  const size_t row_bytes = dim * sizeof(float);
  const size_t pair = sizeof(int64_t) + row_bytes;
  size_t n_owned = 0;
  for (int r = 0; r < n; r++) n_owned += (pt->rlen[r] - GRAD_HEAD) / pair;
  int64_t *okeys = malloc((n_owned ? n_owned : 1) * sizeof *okeys);
  float *ograds = malloc((n_owned ? n_owned : 1) * (row_bytes ? row_bytes : 1));
  if (!okeys || !ograds) {
    free(okeys);
    free(ograds);
    return shard_fail_nomem(err, op);
  }
  size_t filled = 0;
  for (int r = 0; r < n; r++) {
    size_t m = (pt->rlen[r] - GRAD_HEAD) / pair;
    const char *part = recv + pt->roff[r] + GRAD_HEAD;
    memcpy(okeys + filled, part, m * sizeof(int64_t));
    memcpy(ograds + filled * dim, part + m * sizeof(int64_t), m * row_bytes);
    filled += m;
  }
  if (op->average) {
    const float inv = 1.0f / (float)n;
    for (size_t i = 0; i < n_owned * dim; i++) ograds[i] *= inv;
  }
  /* Called with no keys too: a step counts for every rank's table (lazy
   * Adam's bias correction reads the table's step count). */
  dynemb_apply_stats s = {0};
  int rc = dynemb_apply(t, okeys, n_owned, ograds, lr, NULL, &s);
  free(okeys);
  free(ograds);
  if (rc != DYNEMB_OK) return shard_fail_engine(err, rc, op);
  if (applied) *applied = s.applied;
  return 0;
}

int dynemb_shard_apply(dynemb_comm *c, dynemb_shard_op *op, dynemb_table *t,
                       const int64_t *keys, size_t n, const float *grads,
                       float learning_rate, size_t *applied,
                       dynemb_shard_error *err) {
  *err = (dynemb_shard_error){0};
  shard_label(c, op);
  const int ranks = dynemb_comm_size(c), me = dynemb_comm_rank(c);
  const size_t dim = (size_t)dynemb_table_dim(t);
  const size_t row_bytes = dim * sizeof(float);
  dynemb_table_config cfg;
  dynemb_table_get_config(t, &cfg);
  int64_t status = 0;
  char *send = NULL, *recv = NULL;
  float *sums = NULL;
  dynemb_shard_route rt = {0};
  parts pt;
  if (shard_parts_alloc(&pt, ranks)) return shard_fail_nomem(err, op);
  if (dynemb_shard_route_build(&rt, keys, n, op->replicated ? 1 : ranks))
    status = PART_FAILED;
  /* a key's rows summed here, in the batch's order */
  if (!status && !(sums = calloc(rt.n_unique ? rt.n_unique * dim : 1,
                                 sizeof *sums)))
    status = PART_FAILED;
  if (status) shard_fail_nomem(err, op);
  for (size_t i = 0; !status && i < n; i++) {
    float *s = sums + rt.uniq_of[i] * dim;
    for (size_t d = 0; d < dim; d++) s[d] += grads[i * dim + d];
  }
  grads_arg ga = {&rt, sizeof(int64_t) + row_bytes, op->replicated};
  if (!(send = shard_layout(&pt, ranks, GRAD_HEAD, status ? NULL : grads_bytes,
                            &ga, op, err))) {
    shard_exchange_failed(c, op, &pt, ranks, 1);
    goto done;
  }
  const int64_t head[4] = {status, (int64_t)dim, cfg.optimizer.kind,
                           hyper_print(&cfg.optimizer)};
  for (int r = 0; r < ranks; r++) {
    char *part = send + pt.soff[r];
    memcpy(part, head, sizeof head);
    int o = op->replicated ? 0 : r;
    size_t u = status ? 0 : rt.first[o + 1] - rt.first[o];
    if (!u) continue;
    memcpy(part + GRAD_HEAD, rt.ukey + rt.first[o], u * sizeof(int64_t));
    memcpy(part + GRAD_HEAD + u * sizeof(int64_t), sums + rt.first[o] * dim,
           u * row_bytes);
  }
  if (shard_exchange(c, op, send, &pt, (void **)&recv, err)) goto done;
  if (status) goto done;
  int bad = shard_failed_peer(recv, &pt, ranks, me);
  if (bad >= 0) {
    shard_fail_peer(err, op, bad);
    goto done;
  }
  if (check_heads(op, recv, &pt, ranks, me, head, ga.pair, err)) goto done;
  owner_apply(op, t, recv, &pt, ranks, dim, learning_rate, applied, err);
done:
  free(pt.soff);
  free(send);
  free(recv);
  free(sums);
  dynemb_shard_route_free(&rt);
  return err->code;
}
