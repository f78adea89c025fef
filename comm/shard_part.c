/*
 * shard_part.c -- the parts of the shard room's exchanges (shard_int.h):
 * every part a rank sends begins with a status word, a rank that failed
 * still sends its parts (with a failed status) so that its peers fail at
 * once naming it, and every exchange runs on the op's own channel. Also
 * the call's error and the channel's label, which name the op the same way
 * in every verb, and dynemb_shard_failed, which knows how many exchanges
 * each verb runs.
 */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "shard_int.h"

int shard_parts_alloc(parts *pt, int n) {
  size_t *a = calloc((size_t)n * 4, sizeof *a);
  if (!a) return -1;
  *pt = (parts){a, a + n, a + 2 * n, a + 3 * n};
  return 0;
}

int shard_failed_peer(const char *recv, const parts *pt, int n, int me) {
  for (int p = 0; p < n; p++) {
    if (p == me) continue;
    int64_t s = PART_FAILED;
    if (pt->rlen[p] >= sizeof s) memcpy(&s, recv + pt->roff[p], sizeof s);
    if (s != 0) return p;
  }
  return -1;
}

void shard_exchange_failed(dynemb_comm *c, const dynemb_shard_op *op,
                           parts *pt, int n, int times) {
  /* (as long as any verb's head, so that no peer reads past a part) */
  int64_t head[4] = {PART_FAILED, 0, 0, 0};
  for (int r = 0; r < n; r++) {
    pt->soff[r] = 0;
    pt->slen[r] = sizeof head;
  }
  char err[256];
  for (int i = 0; i < times; i++) {
    void *recv = NULL;
    dynemb_comm_alltoallv(c, op->channel, head, pt->soff, pt->slen, &recv,
                          pt->roff, pt->rlen, err, sizeof err);
    free(recv);
  }
}

const char *shard_verb(const dynemb_shard_op *op) {
  switch (op->kind) {
  case DYNEMB_SHARD_LOOKUP: return "sharded lookup";
  case DYNEMB_SHARD_APPLY: return "sharded apply";
  default: return "allreduce";
  }
}

int shard_fail(dynemb_shard_error *err, int code, const char *fmt, ...) {
  if (err->code) return err->code;
  err->code = code;
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(err->msg, sizeof err->msg, fmt, ap);
  va_end(ap);
  return code;
}

int shard_fail_engine(dynemb_shard_error *err, int rc,
                      const dynemb_shard_op *op) {
  const char *m = dynemb_last_error();
  if (!err->code) err->engine_code = rc;
  return shard_fail(err, DYNEMB_SHARD_EENGINE, "dynemb %s: %s",
                    shard_verb(op), (m && *m) ? m : dynemb_strerror(rc));
}

int shard_fail_peer(dynemb_shard_error *err, const dynemb_shard_op *op,
                    int p) {
  if (!op->table)
    return shard_fail(err, DYNEMB_SHARD_EPEER,
                      "dynemb %s: rank %d failed this step (its own error "
                      "says why)",
                      shard_verb(op), p);
  return shard_fail(err, DYNEMB_SHARD_EPEER,
                    "dynemb %s of table '%s': rank %d failed this step (its "
                    "own error says why)",
                    shard_verb(op), op->table, p);
}

int shard_fail_nomem(dynemb_shard_error *err, const dynemb_shard_op *op) {
  return shard_fail(err, DYNEMB_SHARD_ENOMEM, "dynemb %s: out of memory",
                    shard_verb(op));
}

int shard_exchange(dynemb_comm *c, const dynemb_shard_op *op,
                   const void *send, parts *pt, void **recv,
                   dynemb_shard_error *err) {
  char e[1024];
  if (dynemb_comm_alltoallv(c, op->channel, send, pt->soff, pt->slen, recv,
                            pt->roff, pt->rlen, e, sizeof e) == 0)
    return 0;
  shard_fail(err, DYNEMB_SHARD_EEXCHANGE, "dynemb %s%s%s%s: %s",
             shard_verb(op), op->table ? " of table '" : "",
             op->table ? op->table : "", op->table ? "'" : "", e);
  return -1;
}

char *shard_layout(parts *pt, int n, size_t head,
                   size_t (*bytes)(const void *, int), const void *arg,
                   const dynemb_shard_op *op, dynemb_shard_error *err) {
  size_t total = 0;
  for (int r = 0; r < n; r++) {
    pt->soff[r] = total;
    pt->slen[r] = head + (bytes ? bytes(arg, r) : 0);
    total += pt->slen[r];
    if (pt->slen[r] > (size_t)INT32_MAX - 64) { /* one MPI message */
      shard_fail(err, DYNEMB_SHARD_EINVAL,
                 "dynemb %s: this batch sends %zu bytes to rank %d, more "
                 "than one MPI message holds (2 GiB); use smaller batches or "
                 "more ranks",
                 shard_verb(op), pt->slen[r], r);
      return NULL;
    }
  }
  char *send = calloc(total ? total : 1, 1);
  if (!send) shard_fail_nomem(err, op);
  return send;
}

void shard_label(dynemb_comm *c, dynemb_shard_op *op) {
  if (atomic_load_explicit(&op->labelled, memory_order_relaxed)) return;
  static const char *const reductions[] = {"sum",  "mean", "broadcast",
                                           "prod", "max",  "min"};
  char label[256];
  int per_run = 2; /* exchanges per call */
  if (op->kind == DYNEMB_SHARD_ALLREDUCE) {
    int r = op->reduction;
    snprintf(label, sizeof label, "dense all-reduce (%s)",
             r >= 0 && r <= DYNEMB_SHARD_MIN ? reductions[r] : "?");
  } else if (op->kind == DYNEMB_SHARD_APPLY) {
    snprintf(label, sizeof label, "gradients of table '%s'", op->table);
    per_run = 1;
  } else {
    snprintf(label, sizeof label, "lookup of table '%s' (%s)", op->table,
             op->mode == DYNEMB_LOOKUP_EVAL ? "eval" : "train");
    per_run = op->replicated ? 1 : 2;
  }
  if (!dynemb_comm_label(c, op->channel, label, per_run, NULL, 0))
    atomic_store_explicit(&op->labelled, 1, memory_order_relaxed);
}

void dynemb_shard_failed(dynemb_comm *c, dynemb_shard_op *op) {
  const int n = dynemb_comm_size(c);
  int times = op->kind == DYNEMB_SHARD_APPLY ? 1 : 2;
  if (op->kind == DYNEMB_SHARD_LOOKUP && op->replicated) times = 1;
  parts pt;
  shard_label(c, op);
  if (shard_parts_alloc(&pt, n)) return; /* (the peers time out naming it) */
  shard_exchange_failed(c, op, &pt, n, times);
  free(pt.soff);
}
