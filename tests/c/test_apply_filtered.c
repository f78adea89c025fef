/*
 * test_apply_filtered.c -- the filtered dynemb_apply updates exactly the rows a
 * plain dynemb_apply of the trainable keys' gradients updates, and counts the
 * others as dropped. Reference: a twin table that gets only the trainable
 * occurrences through dynemb_apply.
 */
#include <stdint.h>
#include <stdlib.h>

#include "check.h"
#include "dynemb.h"

static dynemb_table *make(const char *name) {
  dynemb_table_config c;
  dynemb_table_config_init(&c);
  c.name = name;
  c.dim = 5;
  c.init.kind = DYNEMB_INIT_UNIFORM;
  c.init.a = -1.0f;
  c.init.b = 1.0f;
  c.init.seed = 11;
  c.optimizer.kind = DYNEMB_OPT_ADAGRAD;
  c.optimizer.learning_rate = 0.1f;
  c.optimizer.initial_accumulator_value = 0.1f;
  dynemb_table *t = NULL;
  CHECK_OK(dynemb_table_create(&c, &t));
  return t;
}

static void filtered_equals_plain_apply_of_trainable_keys(void) {
  dynemb_table *a = make("filt_a"), *b = make("filt_b");
  enum { N = 400, K = 60, D = 5 };
  int64_t keys[N], kept[N];
  float grads[N * D], kept_grads[N * D];
  float out[N * D];
  srand(5);
  for (int i = 0; i < N; i++) keys[i] = (rand() % K) * 7919 - 100000;
  /* every key gets a row in both tables */
  CHECK_OK(dynemb_lookup(a, keys, N, DYNEMB_LOOKUP_TRAIN, 0, NULL, out, NULL));
  CHECK_OK(dynemb_lookup(b, keys, N, DYNEMB_LOOKUP_TRAIN, 0, NULL, out, NULL));
  for (int step = 0; step < 5; step++) {
    int64_t trainable[K];
    size_t na = 0;
    for (int k = K - 1; k >= 0; k--) /* any order */
      if ((k + step) % 3) trainable[na++] = k * 7919 - 100000;
    size_t nk = 0;
    for (int i = 0; i < N; i++) {
      for (int d = 0; d < D; d++)
        grads[i * D + d] = (float)((i * 31 + d * 7 + step) % 13) / 13.0f - 0.5f;
      int k = (int)((keys[i] + 100000) / 7919);
      if ((k + step) % 3) {
        kept[nk] = keys[i];
        memcpy(kept_grads + nk * D, grads + i * D, sizeof(float) * D);
        nk++;
      }
    }
    dynemb_apply_stats sa, sb;
    CHECK_OK(dynemb_apply(
        a, keys, N, grads, -1.0f,
        &(dynemb_apply_opts){
            .filtered = 1, .trainable = trainable, .n_trainable = na},
        &sa));
    CHECK_OK(dynemb_apply(b, kept, nk, kept_grads, -1.0f, NULL, &sb));
    CHECK(sa.applied == sb.applied);
    CHECK(sa.dropped_unknown == sa.unique_keys - sb.unique_keys);
  }
  dynemb_snapshot x, y;
  CHECK_OK(dynemb_table_snapshot(a, &x));
  CHECK_OK(dynemb_table_snapshot(b, &y));
  CHECK(x.rows == y.rows);
  CHECK(memcmp(x.values, y.values, x.rows * (size_t)x.row_floats * sizeof(float)) == 0);
  dynemb_snapshot_free(&x);
  dynemb_snapshot_free(&y);
  /* an empty trainable set drops everything */
  dynemb_apply_stats s;
  CHECK_OK(dynemb_apply(
      a, keys, N, grads, -1.0f,
      &(dynemb_apply_opts){.filtered = 1, .trainable = NULL, .n_trainable = 0},
      &s));
  CHECK(s.applied == 0 && s.dropped_unknown == s.unique_keys);
  int64_t two[3] = {keys[7], keys[3], keys[7]}; /* any order, repeats */
  CHECK_OK(dynemb_apply(
      a, keys, N, grads, -1.0f,
      &(dynemb_apply_opts){.filtered = 1, .trainable = two, .n_trainable = 3},
      &s));
  CHECK(s.applied == (keys[3] == keys[7] ? 1u : 2u));
  dynemb_table_release(a);
  dynemb_table_release(b);
  dynemb_registry_clear();
}

int main(void) {
  RUN(filtered_equals_plain_apply_of_trainable_keys);
  return check_summary();
}
