/*
 * shard_allreduce.c -- dynemb_shard_allreduce (shard.h): dense values
 * reduced over the ranks in two exchanges on the op's channel, a
 * reduce-scatter (rank r gets everyone's chunk r and reduces it, in rank
 * order, so every rank gets the same bits) and an all-gather (every rank
 * gets every reduced chunk). Each rank sends its whole data once and
 * receives it once, whatever the rank count.
 *
 * Both parts: {status, element count of the whole | type << 48}, then
 * values; ranks that reduce different counts or types fail naming both.
 */
#include <stdlib.h>
#include <string.h>

#include "shard_int.h"

enum { REDUCE_HEAD = 2 * sizeof(int64_t) };

/* The r-th of n ranks' chunk of `total` elements: [lo, hi). (total is
 * below 2^48, the head's bits for it.) */
static void chunk(size_t total, int n, int r, size_t *lo, size_t *hi) {
  *lo = (size_t)((uint64_t)total * (uint64_t)r / (uint64_t)n);
  *hi = (size_t)((uint64_t)total * (uint64_t)(r + 1) / (uint64_t)n);
}

/* acc[i] = acc[i] (op) v[i] for n elements of one type; integers add and
 * multiply as unsigned (wrapping, as TensorFlow's integer ops do, instead of
 * overflowing); max and min keep a NaN. */
#define COMBINE(T, U)                                                      \
  do {                                                                     \
    T *a = acc;                                                            \
    const T *b = v;                                                        \
    for (size_t i = 0; i < n; i++) switch (red) {                          \
        case DYNEMB_SHARD_PROD: a[i] = (T)((U)a[i] * (U)b[i]); break;      \
        case DYNEMB_SHARD_MAX:                                             \
          if (b[i] > a[i] || b[i] != b[i]) a[i] = b[i];                    \
          break;                                                           \
        case DYNEMB_SHARD_MIN:                                             \
          if (b[i] < a[i] || b[i] != b[i]) a[i] = b[i];                    \
          break;                                                           \
        default: a[i] = (T)((U)a[i] + (U)b[i]); break;                     \
      }                                                                    \
  } while (0)

static void combine(int type, int red, void *acc, const void *v, size_t n) {
  switch (type) {
  case DYNEMB_SHARD_DOUBLE: COMBINE(double, double); break;
  case DYNEMB_SHARD_INT32: COMBINE(int32_t, uint32_t); break;
  case DYNEMB_SHARD_INT64: COMBINE(int64_t, uint64_t); break;
  default: COMBINE(float, float); break;
  }
}
#undef COMBINE

/* acc[i] /= ranks, for the mean of a floating type. */
static void divide(int type, void *acc, size_t n, int ranks) {
  if (type == DYNEMB_SHARD_DOUBLE)
    for (size_t i = 0; i < n; i++) ((double *)acc)[i] /= (double)ranks;
  else
    for (size_t i = 0; i < n; i++) ((float *)acc)[i] /= (float)ranks;
}

static size_t type_size(int type) {
  switch (type) {
  case DYNEMB_SHARD_FLOAT: return sizeof(float);
  case DYNEMB_SHARD_DOUBLE: return sizeof(double);
  case DYNEMB_SHARD_INT32: return sizeof(int32_t);
  case DYNEMB_SHARD_INT64: return sizeof(int64_t);
  default: return 0;
  }
}

/* This rank's chunk reduced over every rank's part of it, into `mine`
 * (`part`: room for one chunk, as parts need not be aligned). */
static void reduce_chunk(const dynemb_shard_op *op, int type, const char *recv,
                         const parts *pt, int ranks, void *mine, void *part,
                         size_t n, size_t es) {
  for (int r = 0; r < ranks; r++) {
    if (op->reduction == DYNEMB_SHARD_BROADCAST && r != 0) continue;
    memcpy(r == 0 ? mine : part, recv + pt->roff[r] + REDUCE_HEAD, n * es);
    if (r > 0) combine(type, op->reduction, mine, part, n);
  }
  if (op->reduction == DYNEMB_SHARD_MEAN) divide(type, mine, n, ranks);
}

/* The reduce-scatter's heads against this rank's: 0, or the error. */
static int check_heads(const char *recv, const parts *pt, int ranks, int me,
                       int64_t want, dynemb_shard_error *err) {
  const int64_t mask = (INT64_C(1) << 48) - 1;
  for (int r = 0; r < ranks; r++) {
    int64_t head[2] = {0, -1};
    if (pt->rlen[r] >= REDUCE_HEAD) memcpy(head, recv + pt->roff[r], sizeof head);
    if (head[1] != want)
      return shard_fail(
          err, DYNEMB_SHARD_EMISMATCH,
          "dynemb allreduce: rank %d reduces %lld values of type %d, rank %d "
          "%lld of type %d; every rank must reduce the same tensors (same "
          "model, same shapes and dtypes)",
          me, (long long)(want & mask), (int)(want >> 48), r,
          (long long)(head[1] & mask), (int)(head[1] >> 48));
  }
  return 0;
}

int dynemb_shard_allreduce(dynemb_comm *c, dynemb_shard_op *op, int type,
                           void *values, size_t count,
                           dynemb_shard_error *err) {
  *err = (dynemb_shard_error){0};
  shard_label(c, op);
  const int ranks = dynemb_comm_size(c), me = dynemb_comm_rank(c);
  const size_t es = type_size(type);
  char *flat = values, *send = NULL, *recv = NULL, *gathered = NULL;
  char *mine = NULL, *part = NULL;
  int64_t status = 0;
  parts pt;
  if (shard_parts_alloc(&pt, ranks)) return shard_fail_nomem(err, op);
  if (!es)
    status = PART_FAILED,
    shard_fail(err, DYNEMB_SHARD_EINVAL, "dynemb allreduce: type %d is not "
               "float, double, int32 or int64", type);
  if (!status && count >= (size_t)1 << 48)
    status = PART_FAILED,
    shard_fail(err, DYNEMB_SHARD_EINVAL,
               "dynemb allreduce: %zu values; at most 2^48", count);
  if (!status && op->reduction == DYNEMB_SHARD_MEAN &&
      type != DYNEMB_SHARD_FLOAT && type != DYNEMB_SHARD_DOUBLE)
    status = PART_FAILED,
    shard_fail(err, DYNEMB_SHARD_EINVAL,
               "dynemb allreduce: 'mean' of integer tensors; reduce with "
               "'sum' and divide, or cast them to a float type first");
  const size_t total = status ? 0 : count;
  /* Reduce-scatter: rank r gets everyone's chunk r. */
  size_t bytes = 0;
  for (int r = 0; r < ranks; r++) {
    size_t lo, hi;
    chunk(total, ranks, r, &lo, &hi);
    pt.soff[r] = bytes;
    pt.slen[r] = REDUCE_HEAD + (hi - lo) * es;
    bytes += pt.slen[r];
  }
  if (!(send = malloc(bytes))) {
    shard_fail_nomem(err, op);
    shard_exchange_failed(c, op, &pt, ranks, 2);
    goto done;
  }
  const int64_t want = (int64_t)total | ((int64_t)type << 48);
  for (int r = 0; r < ranks; r++) {
    int64_t head[2] = {status, want};
    size_t lo, hi;
    memcpy(send + pt.soff[r], head, sizeof head);
    chunk(total, ranks, r, &lo, &hi);
    if (hi > lo)
      memcpy(send + pt.soff[r] + REDUCE_HEAD, flat + lo * es, (hi - lo) * es);
  }
  if (shard_exchange(c, op, send, &pt, (void **)&recv, err)) {
    shard_exchange_failed(c, op, &pt, ranks, 1);
    goto done;
  }
  int bad = shard_failed_peer(recv, &pt, ranks, me);
  size_t lo, hi;
  chunk(total, ranks, me, &lo, &hi);
  const size_t mine_n = hi - lo;
  if (!status && bad < 0 && check_heads(recv, &pt, ranks, me, want, err))
    status = PART_FAILED;
  int64_t own_status = status || bad >= 0 ? PART_FAILED : 0;
  mine = calloc(mine_n ? mine_n : 1, es ? es : 1);
  part = malloc((mine_n ? mine_n : 1) * (es ? es : 1));
  if (!mine || !part) {
    shard_fail_nomem(err, op);
    shard_exchange_failed(c, op, &pt, ranks, 1);
    goto done;
  }
  if (!own_status)
    reduce_chunk(op, type, recv, &pt, ranks, mine, part, mine_n, es);
  /* All-gather: every rank gets every reduced chunk. */
  free(send);
  const size_t gbytes = REDUCE_HEAD + (own_status ? 0 : mine_n * es);
  if (!(send = malloc(gbytes))) {
    shard_fail_nomem(err, op);
    shard_exchange_failed(c, op, &pt, ranks, 1);
    goto done;
  }
  const int64_t ghead[2] = {own_status, (int64_t)total};
  memcpy(send, ghead, sizeof ghead);
  if (!own_status) memcpy(send + REDUCE_HEAD, mine, mine_n * es);
  for (int r = 0; r < ranks; r++) {
    pt.soff[r] = 0;
    pt.slen[r] = gbytes;
  }
  if (shard_exchange(c, op, send, &pt, (void **)&gathered, err)) goto done;
  if (status) goto done;
  if (bad < 0) bad = shard_failed_peer(gathered, &pt, ranks, me);
  if (bad >= 0) {
    shard_fail_peer(err, op, bad);
    goto done;
  }
  for (int r = 0; r < ranks; r++) {
    size_t rlo, rhi;
    chunk(total, ranks, r, &rlo, &rhi);
    if (pt.rlen[r] != REDUCE_HEAD + (rhi - rlo) * es) {
      shard_fail(err, DYNEMB_SHARD_EPROTOCOL,
                 "dynemb allreduce: rank %d sent a chunk of the wrong size", r);
      goto done;
    }
    if (rhi > rlo)
      memcpy(flat + rlo * es, gathered + pt.roff[r] + REDUCE_HEAD,
             (rhi - rlo) * es);
  }
done:
  free(mine);
  free(part);
  free(send);
  free(recv);
  free(gathered);
  free(pt.soff);
  return err->code;
}
