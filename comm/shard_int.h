/*
 * shard_int.h -- what the shard room's verbs share (shard_part.c): the
 * per-rank arrays of an exchange, the status word every part begins with,
 * one exchange on an op's channel, laying out the parts, and setting the
 * call's error. The verbs are shard_lookup.c, shard_apply.c and
 * shard_allreduce.c; the API is shard.h. Not installed.
 */
#ifndef DYNEMB_SHARD_INT_H
#define DYNEMB_SHARD_INT_H

#include <stddef.h>
#include <stdint.h>

#include "shard.h"

/* Per-rank arrays of the exchanges (offsets and lengths, sent and
 * received), one allocation (free soff). */
typedef struct parts {
  size_t *soff, *slen, *roff, *rlen;
} parts;

/* 0, or -1 when out of memory. */
int shard_parts_alloc(parts *pt, int n);

/* Status words: 0 is fine; a failing rank sends this. */
#define PART_FAILED 1

/* The first rank p (not `me`) whose part begins with a nonzero status, or
 * -1. Parts shorter than a status word count as failed. */
int shard_failed_peer(const char *recv, const parts *pt, int n, int me);

/* Takes part in `times` more exchanges of the call with a failed head only:
 * this rank failed, and every rank must run every exchange of the call
 * (shard.h). */
void shard_exchange_failed(dynemb_comm *c, const dynemb_shard_op *op,
                           parts *pt, int n, int times);

/* One exchange on the op's channel; on failure sets `err` (EEXCHANGE). */
int shard_exchange(dynemb_comm *c, const dynemb_shard_op *op,
                   const void *send, parts *pt, void **recv,
                   dynemb_shard_error *err);

/* Lays out one part per rank: part r is head + bytes(arg, r) long (bytes
 * NULL: the head alone). Returns the send buffer (zeroed), or NULL after
 * setting `err` (a part above one MPI message, out of memory). */
char *shard_layout(parts *pt, int n, size_t head,
                   size_t (*bytes)(const void *, int), const void *arg,
                   const dynemb_shard_op *op, dynemb_shard_error *err);

/* "sharded lookup", "sharded apply" or "allreduce": the op in messages. */
const char *shard_verb(const dynemb_shard_op *op);

/* Names the op's channel in the exchange's errors, once per op. */
void shard_label(dynemb_comm *c, dynemb_shard_op *op);

/* Sets err (unless it holds a failure already: the first one stands) and
 * returns err->code. */
int shard_fail(dynemb_shard_error *err, int code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
/* The engine's last error for its code `rc`. */
int shard_fail_engine(dynemb_shard_error *err, int rc,
                      const dynemb_shard_op *op);
/* Rank p failed this call (EPEER). */
int shard_fail_peer(dynemb_shard_error *err, const dynemb_shard_op *op,
                    int p);
/* Out of memory in the op (ENOMEM). */
int shard_fail_nomem(dynemb_shard_error *err, const dynemb_shard_op *op);

#endif
