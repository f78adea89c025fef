/*
 * shard.h -- what several ranks do together: a table sharded across the
 * ranks of an MPI launch (look up a batch of keys, apply their gradients)
 * and the all-reduce of dense tensors. Plain C below TensorFlow, built
 * only on the exchange (dynemb_comm.h) and the engine (dynemb.h), so that
 * the protocol has one home: the TensorFlow ops of several ranks
 * (tf/sharded_ops.c) only turn tensors into these calls, and the protocol
 * is tested under mpirun without TensorFlow (tests/mpi/mpi_shard.c).
 *
 * Each rank owns the keys that dynemb_key_shard(key, ranks) assigns to it;
 * its local table holds only those (or, `replicated`, every rank holds the
 * whole table and looks up every rank's keys alike).
 *
 * An op runs on its own channel of the exchange, the same on every rank,
 * and every call of it runs the same exchanges on that channel in the same
 * order whatever happens: a rank that failed, before the call
 * (dynemb_shard_failed) or inside it, still takes part with a failed
 * status, so its peers fail at once naming it instead of waiting for the
 * exchange's deadline, and the channel's sequence stays the same on every
 * rank. That is the room's half of why the exchanges cannot deadlock
 * (docs/distributed.md). The other half, which channels run in which order,
 * is the caller's, because only it knows the graph: every rank must call
 * the ops of one channel in the same order, one call at a time per
 * channel, and a thread that waits in one op must not be what another
 * rank's op waits for (the Python package puts a graph's exchange ops into
 * chains, each op depending on the one before it, python/dynemb/core/
 * exchange.py; a C caller that runs ops in one order on one thread per
 * chain gets the same).
 *
 * Every function returns DYNEMB_SHARD_OK (0) or the code of *err, which
 * also gets a sentence naming the op, the table and the rank at fault. The
 * first failure of a call is the one reported.
 */
#ifndef DYNEMB_SHARD_H
#define DYNEMB_SHARD_H

#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#include "dynemb.h"
#include "dynemb_comm.h"

/* What runs on a channel. */
enum dynemb_shard_kind {
  DYNEMB_SHARD_LOOKUP = 0,   /* dynemb_shard_lookup: two exchanges a call
                                (one when replicated) */
  DYNEMB_SHARD_APPLY = 1,    /* dynemb_shard_apply: one exchange */
  DYNEMB_SHARD_ALLREDUCE = 2 /* dynemb_shard_allreduce: two exchanges */
};

enum dynemb_shard_reduction {
  DYNEMB_SHARD_SUM = 0,
  DYNEMB_SHARD_MEAN = 1, /* float types only */
  DYNEMB_SHARD_BROADCAST = 2, /* rank 0's values */
  DYNEMB_SHARD_PROD = 3,
  DYNEMB_SHARD_MAX = 4,
  DYNEMB_SHARD_MIN = 5
};

/* Element types of an all-reduce. The numbers are TensorFlow's DataType
 * ones, so a binding passes its type through. */
enum dynemb_shard_type {
  DYNEMB_SHARD_FLOAT = 1,
  DYNEMB_SHARD_DOUBLE = 2,
  DYNEMB_SHARD_INT32 = 3,
  DYNEMB_SHARD_INT64 = 9
};

/* One op of several ranks: what it is and its settings, the same on every
 * rank. The caller keeps it for the op's lifetime (its first call names the
 * channel in the exchange's errors, dynemb_comm_label). */
typedef struct dynemb_shard_op {
  int kind;          /* enum dynemb_shard_kind */
  uint32_t channel;  /* the exchange's channel */
  const char *table; /* LOOKUP, APPLY: the table's name (errors, label) */
  int replicated;    /* LOOKUP, APPLY: every rank holds the whole table */
  int mode;          /* LOOKUP: DYNEMB_LOOKUP_TRAIN or DYNEMB_LOOKUP_EVAL */
  uint32_t weight;   /* LOOKUP: sightings per occurrence, 1 .. 2^31-1 */
  int64_t send_count; /* LOOKUP: unique keys to one owner at most (mxRec's
                          static-shape mode); 0: any */
  int average;       /* APPLY: divide the rows by the rank count */
  int reduction;     /* ALLREDUCE: enum dynemb_shard_reduction */
  _Atomic int labelled; /* the room's: the comm knows the channel's label */
} dynemb_shard_op;

enum dynemb_shard_status {
  DYNEMB_SHARD_OK = 0,
  DYNEMB_SHARD_EINVAL = 1,    /* the call's input: send_count exceeded, a
                                 part above one MPI message (2 GiB), the
                                 mean of integers, an unknown type */
  DYNEMB_SHARD_ENOMEM = 2,
  DYNEMB_SHARD_EENGINE = 3,   /* the engine failed: engine_code */
  DYNEMB_SHARD_EEXCHANGE = 4, /* the exchange failed: a rank silent, gone,
                                 or in another exchange (dynemb_comm.h) */
  DYNEMB_SHARD_EPEER = 5,     /* another rank failed this call (its own
                                 error says why) */
  DYNEMB_SHARD_EMISMATCH = 6, /* the ranks' tables (dim, optimizer) or
                                 tensors (count, type) differ */
  DYNEMB_SHARD_EPROTOCOL = 7  /* a peer's part contradicts its own head */
};

typedef struct dynemb_shard_error {
  int code;        /* enum dynemb_shard_status */
  int engine_code; /* EENGINE: the engine's DYNEMB_E* code */
  char msg[1280];
} dynemb_shard_error;

/* Looks up keys[n] across the ranks: each unique key goes to its owner,
 * which looks up the keys of every rank in rank order with the largest
 * `now` of all ranks (a TRAIN lookup counts every occurrence of the global
 * batch for admission, `weight` sightings each, in the order one process
 * would count the ranks' batches concatenated), and one row per unique key
 * comes back. Writes n * dim floats to `rows` (the table's default value
 * for the occurrences that came before their key's admission, or for keys
 * unknown to an EVAL lookup) and, if `found` is not NULL, found[i] = 1
 * where keys[i] read a row. `t` is this rank's part of the table (the same
 * configuration on every rank). Errors: EINVAL (send_count), ENOMEM,
 * EENGINE, EEXCHANGE, EPEER, EMISMATCH (another dim on a rank), EPROTOCOL. */
int dynemb_shard_lookup(dynemb_comm *c, dynemb_shard_op *op, dynemb_table *t,
                        const int64_t *keys, size_t n, int64_t now,
                        float *rows, unsigned char *found,
                        dynemb_shard_error *err);

/* Applies gradients grads[n * dim] of keys[n] at their owners: a rank sums
 * the rows of each of its keys, each owner applies every rank's rows in one
 * dynemb_apply (so a key is updated once per call with the gradient summed
 * over ranks, as for the global batch; `average` divides by the rank
 * count first). Every rank's table counts the step, with or without keys.
 * *applied (may be NULL): the rows this rank's table updated. Errors:
 * ENOMEM, EENGINE, EEXCHANGE, EPEER, EMISMATCH (another dim or optimizer
 * on a rank: kind or hyper-parameters, the learning rate aside). */
int dynemb_shard_apply(dynemb_comm *c, dynemb_shard_op *op, dynemb_table *t,
                       const int64_t *keys, size_t n, const float *grads,
                       float learning_rate, size_t *applied,
                       dynemb_shard_error *err);

/* Reduces values[count] of `type` (enum dynemb_shard_type) elementwise
 * over the ranks, in place: the op's reduction, the same bits on every
 * rank (a reduce-scatter and an all-gather, reducing in rank order).
 * Integers add and multiply wrapping; max and min keep a NaN. Errors:
 * EINVAL, ENOMEM, EEXCHANGE, EPEER, EMISMATCH (another count or type on a
 * rank), EPROTOCOL. */
int dynemb_shard_allreduce(dynemb_comm *c, dynemb_shard_op *op, int type,
                           void *values, size_t count,
                           dynemb_shard_error *err);

/* What a rank calls instead of the op when it failed before it could (its
 * input, its table missing): it runs the op's exchanges with a failed
 * status, so the peers fail at once naming it. Its own error is the
 * caller's to report. */
void dynemb_shard_failed(dynemb_comm *c, dynemb_shard_op *op);

#endif
