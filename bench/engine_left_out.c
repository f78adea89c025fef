/*
 * engine_left_out.c -- stand-ins for the engine's per-batch calls, for the
 * analysis op library that bench/tf_train.py's dynemb_engine_left_out
 * variant loads (`make bench-tf`).
 *
 * The Makefile links the unchanged tf/dynemb_ops.c with -Wl,--wrap=NAME for
 * each NAME of ENGINE_LEFT_OUT_CALLS, so that the kernels' calls of NAME land
 * in __wrap_NAME here: lookups write zero rows, prepares write "no row" for
 * every key, applies update nothing. The kernels still fetch their inputs,
 * find their tables and allocate their outputs, and every other call (table
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

int __wrap_dynemb_lookup(dynemb_table *t, const int64_t *keys, size_t n,
                         int mode, int64_t now, float *out) {
  (void)keys, (void)mode, (void)now;
  return zero_rows(t, n, out);
}

int __wrap_dynemb_lookup_visible(dynemb_table *t, const int64_t *keys,
                                 size_t n, const uint8_t *visible,
                                 float *out) {
  (void)keys, (void)visible;
  return zero_rows(t, n, out);
}

int __wrap_dynemb_lookup_hinted(dynemb_table *t, const int64_t *keys,
                                const uint64_t *hints, size_t n, float *out) {
  (void)keys, (void)hints;
  return zero_rows(t, n, out);
}

int __wrap_dynemb_prepare(dynemb_table *t, const int64_t *keys, size_t n,
                          int mode, int64_t now, uint8_t *admitted) {
  (void)t, (void)keys, (void)mode, (void)now;
  memset(admitted, 0, n);
  return DYNEMB_OK;
}

int __wrap_dynemb_prepare_hints(dynemb_table *t, const int64_t *keys,
                                size_t n, int mode, int64_t now,
                                uint64_t *hints) {
  (void)t, (void)keys, (void)mode, (void)now;
  memset(hints, 0xff, n * sizeof *hints); /* DYNEMB_NO_HINT */
  return DYNEMB_OK;
}

int __wrap_dynemb_apply(dynemb_table *t, const int64_t *keys, size_t n,
                        const float *grads, float learning_rate,
                        dynemb_apply_stats *stats) {
  (void)t, (void)keys, (void)n, (void)grads, (void)learning_rate;
  return no_stats(stats);
}

int __wrap_dynemb_apply_filtered(dynemb_table *t, const int64_t *keys,
                                 size_t n, const float *grads,
                                 float learning_rate, const int64_t *allowed,
                                 size_t n_allowed, dynemb_apply_stats *stats) {
  (void)t, (void)keys, (void)n, (void)grads, (void)learning_rate,
      (void)allowed, (void)n_allowed;
  return no_stats(stats);
}

int __wrap_dynemb_apply_hinted(dynemb_table *t, const int64_t *keys,
                               const uint64_t *hints, size_t n,
                               const float *grads, float learning_rate,
                               dynemb_apply_stats *stats) {
  (void)t, (void)keys, (void)hints, (void)n, (void)grads, (void)learning_rate;
  return no_stats(stats);
}
