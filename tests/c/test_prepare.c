/* dynemb_prepare does to a table exactly what dynemb_lookup does, and its
 * tickets say where that lookup returned a row. Reference: a twin table
 * fed the same batches through dynemb_lookup. A prepared batch read with
 * dynemb_lookup_prepared gives what the twin's eval lookup gives with the
 * keys not admitted at prepare time reading the default value (the
 * reference, written out in this test), also when rows are updated,
 * evicted (stale places), cleared or imported in between, and made-up
 * tickets stay inside the table. The prepared apply (dynemb_apply with tickets)
 * updates what the filtered dynemb_apply does with the batch's admitted keys as
 * its trainable keys. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "dynemb.h"

static dynemb_table *mk(const char *name, uint32_t threshold) {
  dynemb_table_config c;
  dynemb_table_config_init(&c);
  c.name = name;
  c.dim = 3;
  c.init.kind = DYNEMB_INIT_UNIFORM; /* rows never equal the zero default */
  c.init.a = 1.0f;
  c.init.b = 2.0f;
  c.init.seed = 7;
  c.access_threshold = threshold;
  c.shards = 4;
  dynemb_table *t = NULL;
  CHECK_OK(dynemb_table_create(&c, &t));
  return t;
}

static void test_prepare_matches_lookup(void) {
  dynemb_table *a = mk("prep_a", 3), *b = mk("prep_b", 3);
  uint64_t rng = 12345;
  for (int step = 0; step < 40; step++) {
    int64_t keys[64];
    dynemb_ticket tk[64];
    float out[64 * 3];
    for (int i = 0; i < 64; i++) {
      rng = rng * 6364136223846793005ULL + 1442695040888963407ULL;
      keys[i] = (int64_t)(rng >> 33) % 97 - 40; /* repeats, negatives */
    }
    CHECK_OK(dynemb_prepare(a, keys, 64, DYNEMB_LOOKUP_TRAIN, step, NULL, tk));
    CHECK_OK(
        dynemb_lookup(b, keys, 64, DYNEMB_LOOKUP_TRAIN, step, NULL, out, NULL));
    for (int i = 0; i < 64; i++)
      CHECK((tk[i] != DYNEMB_NOT_ADMITTED) == (out[i * 3] != 0.0f));
  }
  dynemb_table_stats sa, sb;
  dynemb_table_get_stats(a, &sa);
  dynemb_table_get_stats(b, &sb);
  CHECK(sa.size == sb.size && sa.candidates == sb.candidates);
  CHECK(sa.rejected == sb.rejected && sa.inserted == sb.inserted);
  CHECK(sa.size > 0 && sa.rejected > 0);
  /* EVAL: no change; admitted = has a row. */
  int64_t probe[2] = {-40, 1000};
  dynemb_ticket tk2[2];
  CHECK_OK(dynemb_prepare(a, probe, 2, DYNEMB_LOOKUP_EVAL, 0, NULL, tk2));
  CHECK(tk2[1] == DYNEMB_NOT_ADMITTED);
  dynemb_table_get_stats(a, &sb);
  CHECK(sb.size == sa.size && sb.candidates == sa.candidates);
  CHECK_RC(dynemb_prepare(a, probe, 2, DYNEMB_LOOKUP_TRAIN, 0, NULL, NULL),
           DYNEMB_EINVAL);
  dynemb_table_release(a);
  dynemb_table_release(b);
  dynemb_registry_clear();
}

/* A ticket is binding: an occurrence that was not admitted when its batch
 * was prepared reads the default value, although the key has a row now
 * (admitted by a later occurrence of the same batch, or a later batch),
 * and keys without a row read it too; the read inserts and counts
 * nothing. */
static void test_prepared_read_keeps_admission(void) {
  dynemb_table *t = mk("binding", 2);
  const float dflt[3] = {9, 8, 7};
  CHECK_OK(dynemb_table_set_default_value(t, dflt));
  /* threshold 2: key 1's first occurrence is counted, its second admits */
  int64_t keys[4] = {1, 1, 3, 1};
  dynemb_ticket tk[4];
  CHECK_OK(dynemb_prepare(t, keys, 4, DYNEMB_LOOKUP_TRAIN, 0, NULL, tk));
  CHECK(tk[0] == DYNEMB_NOT_ADMITTED && tk[1] != DYNEMB_NOT_ADMITTED);
  CHECK(tk[2] == DYNEMB_NOT_ADMITTED && tk[3] != DYNEMB_NOT_ADMITTED);
  /* a later batch admits key 3 */
  int64_t later[1] = {3};
  dynemb_ticket tl[1];
  CHECK_OK(dynemb_prepare(t, later, 1, DYNEMB_LOOKUP_TRAIN, 1, NULL, tl));
  CHECK(tl[0] != DYNEMB_NOT_ADMITTED && dynemb_table_size(t) == 2);
  float rows[6], out[12];
  const int64_t have[2] = {1, 3};
  CHECK_OK(dynemb_lookup(t, have, 2, DYNEMB_LOOKUP_EVAL, 0, NULL, rows, NULL));
  CHECK_OK(dynemb_lookup_prepared(t, keys, tk, 4, out, NULL));
  for (int d = 0; d < 3; d++) {
    CHECK(out[d] == dflt[d]);         /* key 1, first occurrence */
    CHECK(out[3 + d] == rows[d]);     /* key 1, admitted: its row */
    CHECK(out[6 + d] == dflt[d]);     /* key 3 has a row since, but not then */
    CHECK(out[9 + d] == rows[d]);     /* key 1 again */
    CHECK(rows[3 + d] != dflt[d]);
  }
  dynemb_table_stats st;
  dynemb_table_get_stats(t, &st);
  CHECK(st.size == 2 && st.candidates == 0);
  CHECK_RC(dynemb_lookup_prepared(t, keys, NULL, 4, out, NULL), DYNEMB_EINVAL);
  /* which occurrences read a row, also once a row went since the prepare
   * (every row evicted: key 1's tickets are stale, it reads the default) */
  unsigned char found[4];
  CHECK_OK(dynemb_lookup_prepared(t, keys, tk, 4, out, found));
  CHECK(!found[0] && found[1] && !found[2] && found[3]);
  CHECK_OK(dynemb_evict(t, 5, 0, NULL));
  CHECK_OK(dynemb_lookup_prepared(t, keys, tk, 4, out, found));
  CHECK(!found[0] && !found[1] && !found[2] && !found[3]);
  for (int d = 0; d < 3; d++) CHECK(out[3 + d] == dflt[d]);
  dynemb_table_release(t);
  dynemb_registry_clear();
}

enum { HB = 48, HD = 3, AHEAD = 3 };

/* The reference of a prepared read: an eval lookup with the keys that were
 * not admitted at prepare time (`adm` 0) reading the default value
 * (zeros: the tables' rows are drawn from [1, 2)). */
static void masked_eval_lookup(dynemb_table *t, const int64_t *keys,
                               const uint8_t *adm, float *out) {
  CHECK_OK(dynemb_lookup(t, keys, HB, DYNEMB_LOOKUP_EVAL, 0, NULL, out, NULL));
  for (int i = 0; i < HB; i++)
    if (!adm[i]) memset(out + i * HD, 0, HD * sizeof *out);
}

static void test_prepared_batches_match_reference(void) {
  dynemb_table *a = mk("prep_ref_a", 2), *b = mk("prep_ref_b", 2);
  dynemb_table_set_eviction_threshold(a, 4);
  dynemb_table_set_eviction_threshold(b, 4);
  uint64_t rng = 99;
  /* a pipeline AHEAD batches ahead of the step, as in training; the twin
   * b does a train lookup where a prepares, and notes what it admitted */
  int64_t keys[AHEAD][HB];
  dynemb_ticket tickets[AHEAD][HB];
  uint8_t adm[AHEAD][HB];
  int stale_rounds = 0;
  for (int step = 0; step < 120 + AHEAD; step++) {
    if (step < 120) { /* prepare batch `step` */
      int k = step % AHEAD;
      for (int i = 0; i < HB; i++) {
        rng = rng * 6364136223846793005ULL + 1442695040888963407ULL;
        keys[k][i] = (int64_t)(rng >> 33) % 61 - 20;
      }
      float rows[HB * HD];
      CHECK_OK(dynemb_prepare(a, keys[k], HB, DYNEMB_LOOKUP_TRAIN, step, NULL,
                              tickets[k]));
      CHECK_OK(dynemb_lookup(b, keys[k], HB, DYNEMB_LOOKUP_TRAIN, step, NULL,
                             rows, NULL));
      for (int i = 0; i < HB; i++) {
        adm[k][i] = rows[i * HD] != 0.0f;
        CHECK((tickets[k][i] != DYNEMB_NOT_ADMITTED) == adm[k][i]);
      }
    }
    int s = step - (AHEAD - 1); /* the step reads batch s */
    if (s < 0) continue;
    int k = s % AHEAD;
    if (s % 7 == 3) { /* rows leave their places between prepare and read */
      size_t ea = 0, eb = 0;
      CHECK_OK(dynemb_evict(a, step, DYNEMB_TABLE_THRESHOLD, &ea));
      CHECK_OK(dynemb_evict(b, step, DYNEMB_TABLE_THRESHOLD, &eb));
      CHECK(ea == eb);
      stale_rounds += ea > 0;
    }
    if (s == 60) {
      dynemb_table_clear(a);
      dynemb_table_clear(b);
    }
    if (s == 90) { /* import a snapshot of b into both */
      dynemb_snapshot snap;
      CHECK_OK(dynemb_table_snapshot(b, &snap));
      CHECK_OK(dynemb_table_import(a, &snap, DYNEMB_IMPORT_REPLACE, 0, 0));
      CHECK_OK(dynemb_table_import(b, &snap, DYNEMB_IMPORT_REPLACE, 0, 0));
      dynemb_snapshot_free(&snap);
    }
    float oa[HB * HD], ob[HB * HD], g[HB * HD];
    CHECK_OK(dynemb_lookup_prepared(a, keys[k], tickets[k], HB, oa, NULL));
    masked_eval_lookup(b, keys[k], adm[k], ob);
    CHECK(memcmp(oa, ob, sizeof oa) == 0);
    for (int i = 0; i < HB * HD; i++) g[i] = 0.01f * (float)(i % 5) - 0.02f;
    int64_t trainable[HB];
    size_t na = 0;
    for (int i = 0; i < HB; i++)
      if (adm[k][i]) trainable[na++] = keys[k][i];
    dynemb_apply_stats st_a, st_b;
    CHECK_OK(dynemb_apply(a, keys[k], HB, g, 0.5f,
                          &(dynemb_apply_opts){.tickets = tickets[k]}, &st_a));
    CHECK_OK(dynemb_apply(
        b, keys[k], HB, g, 0.5f,
        &(dynemb_apply_opts){
            .filtered = 1, .trainable = trainable, .n_trainable = na},
        &st_b));
    CHECK(st_a.applied == st_b.applied && st_a.unique_keys == st_b.unique_keys);
    CHECK(st_a.dropped_unknown == st_b.dropped_unknown);
  }
  CHECK(stale_rounds > 3);
  /* made-up tickets: no read outside the table (ASan), no error */
  int64_t k2[HB];
  dynemb_ticket junk[HB];
  float o2[HB * HD];
  for (int i = 0; i < HB; i++) {
    rng = rng * 6364136223846793005ULL + 1442695040888963407ULL;
    k2[i] = i;
    junk[i] = rng ^ (rng << 17);
  }
  junk[0] = 0;
  junk[1] = ((uint64_t)3 << 32) | 0xffffffu; /* shard 3, far past its rows */
  CHECK_OK(dynemb_lookup_prepared(a, k2, junk, HB, o2, NULL));
  CHECK_RC(dynemb_lookup_prepared(a, k2, NULL, HB, o2, NULL), DYNEMB_EINVAL);
  for (int i = 0; i < HB * HD; i++) o2[i] = 0.25f;
  CHECK_OK(dynemb_apply(a, k2, HB, o2, 0.1f,
                        &(dynemb_apply_opts){.tickets = junk}, NULL));
  /* (tickets and a filter together: each says which keys train) */
  CHECK_RC(dynemb_apply(a, k2, HB, o2, 0.1f,
                        &(dynemb_apply_opts){.tickets = junk, .filtered = 1},
                        NULL),
           DYNEMB_EINVAL);
  CHECK(strstr(dynemb_last_error(), "both tickets and a trainable") != NULL);
  CHECK_RC(dynemb_apply(NULL, k2, HB, o2, 0.1f,
                        &(dynemb_apply_opts){.tickets = junk}, NULL),
           DYNEMB_EINVAL);
  CHECK(strstr(dynemb_last_error(), "dynemb_apply") != NULL);
  CHECK_RC(dynemb_prepare(a, k2, HB, DYNEMB_LOOKUP_TRAIN, 1, NULL, NULL),
           DYNEMB_EINVAL);
  dynemb_table_release(a);
  dynemb_table_release(b);
  dynemb_registry_clear();
}

int main(void) {
  RUN(test_prepare_matches_lookup);
  RUN(test_prepared_read_keeps_admission);
  RUN(test_prepared_batches_match_reference);
  return check_summary();
}
