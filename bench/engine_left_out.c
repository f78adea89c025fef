/*
 * engine_left_out.c -- stand-ins for the engine's per-batch calls, for the
 * analysis op library that bench/tf_train.py's dynemb_engine_left_out
 * variant loads (`make bench-tf`).
 *
 * The Makefile links the unchanged tf/dynemb_ops.c with -Wl,--wrap=NAME for
 * each NAME of ENGINE_LEFT_OUT_CALLS, so that the kernels' calls of NAME land
 * in __wrap_NAME here: lookups write zero rows, prepares write "not
 * admitted" for every key, applies update nothing. The kernels still fetch
 * their inputs, find their tables and allocate their outputs, and every
 * other call (table
 * creation, checkpoints, statistics, Python's ctypes calls) reaches the real
 * engine, so a step costs what dynemb's graph costs without the engine's own
 * work. Nothing trains with it.
 */
#include <string.h>

#include "dynemb.h"

static int zero_rows(dynemb_table *t, size_t n, float *out) {
  memset(out, 0, n * (size_t)dynemb_table_dim(t) * sizeof *out);
  return DYNEMB_OK;
}

static int no_stats(dynemb_apply_stats *stats) {
  if (stats) memset(stats, 0, sizeof *stats);
  return DYNEMB_OK;
}

/* (with `tickets` given, every key reads as not admitted) */
int __wrap_dynemb_lookup(dynemb_table *t, const int64_t *keys, size_t n,
                         int mode, int64_t now, const dynemb_lookup_opts *opts,
                         float *out, dynemb_ticket *tickets) {
  (void)keys, (void)mode, (void)now, (void)opts;
  if (tickets) memset(tickets, 0xff, n * sizeof *tickets); /* NOT_ADMITTED */
  return zero_rows(t, n, out);
}

int __wrap_dynemb_lookup_prepared(dynemb_table *t, const int64_t *keys,
                                  const dynemb_ticket *tickets, size_t n,
                                  float *out, unsigned char *found) {
  (void)keys, (void)tickets;
  if (found) memset(found, 0, n);
  return zero_rows(t, n, out);
}

int __wrap_dynemb_prepare(dynemb_table *t, const int64_t *keys, size_t n,
                          int mode, int64_t now, const dynemb_lookup_opts *opts,
                          dynemb_ticket *tickets) {
  (void)t, (void)keys, (void)mode, (void)now, (void)opts;
  memset(tickets, 0xff, n * sizeof *tickets); /* DYNEMB_NOT_ADMITTED */
  return DYNEMB_OK;
}

int __wrap_dynemb_apply(dynemb_table *t, const int64_t *keys, size_t n,
                        const float *grads, float learning_rate,
                        const dynemb_apply_opts *opts,
                        dynemb_apply_stats *stats) {
  (void)t, (void)keys, (void)n, (void)grads, (void)learning_rate, (void)opts;
  return no_stats(stats);
}
