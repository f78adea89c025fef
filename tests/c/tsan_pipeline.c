/*
 * tsan_pipeline.c -- the calls an input pipeline makes while training runs,
 * at once, under ThreadSanitizer: "pipeline" threads dynemb_prepare batches
 * ahead, "step" threads read them (one with dynemb_lookup_prepared and
 * updates them with dynemb_apply and the tickets, the other with eval lookups and
 * the filtered dynemb_apply of the admitted keys), and a "serving" thread keeps
 * replacing the
 * default value. Afterwards every row was updated exactly as often as the
 * steps allowed it, and every value a step read was a row value or one of the
 * default values.
 */
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "dynemb.h"

enum { STEPS = 2, ROUNDS = 200, BATCH = 128, KEYS = 4000, DIM = 4 };

static dynemb_table *T;
static int stop_flag;
static int bad_values, errors; /* counted from several threads */
#define COUNT(x) __atomic_fetch_add(&(x), 1, __ATOMIC_RELAXED)
static uint32_t updates[STEPS][KEYS]; /* per step thread */

static int64_t key_of(uint32_t i) { return (int64_t)i * 104729 + 11; }

static void *step(void *arg) {
  const int id = (int)(intptr_t)arg;
  int64_t keys[BATCH];
  uint32_t idx[BATCH];
  uint8_t admitted[BATCH];
  dynemb_ticket tickets[BATCH];
  float out[BATCH * DIM], g[BATCH * DIM];
  for (int i = 0; i < BATCH * DIM; i++) g[i] = 1.0f;
  uint64_t seed = 0x2545f4914f6cdd1dULL * (uint64_t)(id + 1);
  for (int r = 0; r < ROUNDS; r++) {
    for (int i = 0; i < BATCH; i++) {
      seed ^= seed << 13, seed ^= seed >> 7, seed ^= seed << 17;
      idx[i] = (uint32_t)(seed % KEYS);
      keys[i] = key_of(idx[i]);
    }
    /* the pipeline's part, then the step's */
    if (dynemb_prepare(T, keys, BATCH, DYNEMB_LOOKUP_TRAIN, r, NULL, tickets))
      COUNT(errors);
    for (int i = 0; i < BATCH; i++)
      admitted[i] = tickets[i] != DYNEMB_NOT_ADMITTED;
    if (id == 1 ? dynemb_lookup_prepared(T, keys, tickets, BATCH, out, NULL)
                : dynemb_lookup(T, keys, BATCH, DYNEMB_LOOKUP_EVAL, 0, NULL,
                                out, NULL))
      COUNT(errors);
    for (int i = 0; i < BATCH * DIM; i++) {
      float v = out[i]; /* rows start at 0 and only go down by whole steps */
      int is_default = v == 100.0f || v == 200.0f;
      if (!is_default && (v > 0.0f || v != (float)(int)v)) COUNT(bad_values);
    }
    int64_t trainable[BATCH];
    size_t na = 0;
    for (int i = 0; i < BATCH; i++)
      if (admitted[i]) trainable[na++] = keys[i];
    if (id == 1 ? dynemb_apply(T, keys, BATCH, g, 1.0f,
                               &(dynemb_apply_opts){.tickets = tickets}, NULL)
                : dynemb_apply(T, keys, BATCH, g, 1.0f,
                               &(dynemb_apply_opts){.filtered = 1,
                                                    .trainable = trainable,
                                                    .n_trainable = na},
                               NULL))
      COUNT(errors);
    /* every occurrence of a trainable key adds one gradient unit */
    for (int i = 0; i < BATCH; i++) {
      int ok = 0;
      for (size_t j = 0; j < na && !ok; j++) ok = trainable[j] == keys[i];
      if (ok) updates[id][idx[i]]++;
    }
  }
  return NULL;
}

static void *serving(void *arg) {
  (void)arg;
  const float a[DIM] = {100, 100, 100, 100}, b[DIM] = {200, 200, 200, 200};
  for (int k = 0; !__atomic_load_n(&stop_flag, __ATOMIC_RELAXED); k++)
    if (dynemb_table_set_default_value(T, k % 2 ? a : b)) COUNT(errors);
  return NULL;
}

static void test_pipeline_calls_race_free(void) {
  dynemb_table_config c;
  dynemb_table_config_init(&c);
  c.name = "pipeline";
  c.dim = DIM;
  c.shards = 8;
  c.access_threshold = 2;
  c.optimizer.learning_rate = 1.0f;
  CHECK_OK(dynemb_table_create(&c, &T));
  if (!T) return;
  pthread_t th[STEPS], sv;
  pthread_create(&sv, NULL, serving, NULL);
  for (int i = 0; i < STEPS; i++)
    pthread_create(&th[i], NULL, step, (void *)(intptr_t)i);
  for (int i = 0; i < STEPS; i++) pthread_join(th[i], NULL);
  __atomic_store_n(&stop_flag, 1, __ATOMIC_RELAXED);
  pthread_join(sv, NULL);
  CHECK(errors == 0);
  CHECK(bad_values == 0);
  /* each row = -(number of gradient units the steps let through) */
  dynemb_snapshot s;
  CHECK_OK(dynemb_table_snapshot(T, &s));
  size_t checked = 0;
  for (size_t r = 0; r < s.rows; r++) {
    uint32_t i = (uint32_t)((s.keys[r] - 11) / 104729);
    float want = -(float)(updates[0][i] + updates[1][i]);
    for (int d = 0; d < DIM; d++) CHECK(s.values[r * DIM + d] == want);
    checked++;
  }
  CHECK(checked > KEYS / 2);
  dynemb_snapshot_free(&s);
  dynemb_table_release(T);
  dynemb_registry_clear();
}

int main(void) {
  RUN(test_pipeline_calls_race_free);
  return check_summary();
}
