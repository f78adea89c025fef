/* dynemb_prepare does to a table exactly what dynemb_lookup does, and its
 * admitted[] says where that lookup returned a row. Reference: a twin table
 * fed the same batches through dynemb_lookup. Row hints: a table prepared
 * with dynemb_prepare_hints and read with dynemb_lookup_hinted gives what
 * its twin gives with dynemb_prepare + dynemb_lookup_visible, also when
 * rows are updated, evicted (stale hints), cleared or imported in between,
 * and made-up hints stay inside the table. Hinted apply (dynemb_apply_hinted)
 * updates what dynemb_apply_filtered does with the batch's admitted keys as
 * its filter. */
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
    uint8_t adm[64];
    float out[64 * 3];
    for (int i = 0; i < 64; i++) {
      rng = rng * 6364136223846793005ULL + 1442695040888963407ULL;
      keys[i] = (int64_t)(rng >> 33) % 97 - 40; /* repeats, negatives */
    }
    CHECK_OK(dynemb_prepare(a, keys, 64, DYNEMB_LOOKUP_TRAIN, step, adm));
    CHECK_OK(dynemb_lookup(b, keys, 64, DYNEMB_LOOKUP_TRAIN, step, out));
    for (int i = 0; i < 64; i++) CHECK(adm[i] == (out[i * 3] != 0.0f));
  }
  dynemb_table_stats sa, sb;
  dynemb_table_get_stats(a, &sa);
  dynemb_table_get_stats(b, &sb);
  CHECK(sa.size == sb.size && sa.candidates == sb.candidates);
  CHECK(sa.rejected == sb.rejected && sa.inserted == sb.inserted);
  CHECK(sa.size > 0 && sa.rejected > 0);
  /* EVAL: no change; admitted = has a row. */
  int64_t probe[2] = {-40, 1000};
  uint8_t adm2[2];
  CHECK_OK(dynemb_prepare(a, probe, 2, DYNEMB_LOOKUP_EVAL, 0, adm2));
  CHECK(adm2[1] == 0);
  dynemb_table_get_stats(a, &sb);
  CHECK(sb.size == sa.size && sb.candidates == sa.candidates);
  CHECK_RC(dynemb_prepare(a, probe, 2, DYNEMB_LOOKUP_TRAIN, 0, NULL),
           DYNEMB_EINVAL);
  dynemb_table_release(a);
  dynemb_table_release(b);
  dynemb_registry_clear();
}

/* dynemb_lookup_visible: rows where visible, the default elsewhere (also
 * for visible keys without a row); nothing is inserted or counted. */
static void test_lookup_visible_masks_rows(void) {
  dynemb_table *t = mk("visible", 0);
  const float dflt[3] = {9, 8, 7};
  CHECK_OK(dynemb_table_set_default_value(t, dflt));
  int64_t keys[4] = {1, 2, 3, 1};
  float rows[12], out[12];
  CHECK_OK(dynemb_lookup(t, keys, 2, DYNEMB_LOOKUP_TRAIN, 0, rows)); /* 1, 2 */
  const uint8_t visible[4] = {1, 0, 1, 0};
  CHECK_OK(dynemb_lookup_visible(t, keys, 4, visible, out));
  for (int d = 0; d < 3; d++) {
    CHECK(out[d] == rows[d]);          /* key 1, visible: its row */
    CHECK(out[3 + d] == dflt[d]);      /* key 2 has a row but is hidden */
    CHECK(out[6 + d] == dflt[d]);      /* key 3 has no row */
    CHECK(out[9 + d] == dflt[d]);      /* key 1 again, hidden */
  }
  CHECK(dynemb_table_size(t) == 2);    /* nothing inserted */
  CHECK_RC(dynemb_lookup_visible(t, keys, 4, NULL, out), DYNEMB_EINVAL);
  dynemb_table_release(t);
  dynemb_registry_clear();
}

enum { HB = 48, HD = 3, AHEAD = 3 };

static void test_hints_match_visible(void) {
  dynemb_table *a = mk("hint_a", 2), *b = mk("hint_b", 2);
  dynemb_table_set_eviction_threshold(a, 4);
  dynemb_table_set_eviction_threshold(b, 4);
  uint64_t rng = 99;
  /* a pipeline AHEAD batches ahead of the step, as in training */
  int64_t keys[AHEAD][HB];
  uint64_t hints[AHEAD][HB];
  uint8_t adm[AHEAD][HB];
  int stale_rounds = 0;
  for (int step = 0; step < 120 + AHEAD; step++) {
    if (step < 120) { /* prepare batch `step` */
      int k = step % AHEAD;
      for (int i = 0; i < HB; i++) {
        rng = rng * 6364136223846793005ULL + 1442695040888963407ULL;
        keys[k][i] = (int64_t)(rng >> 33) % 61 - 20;
      }
      CHECK_OK(dynemb_prepare_hints(a, keys[k], HB, DYNEMB_LOOKUP_TRAIN, step, hints[k]));
      CHECK_OK(dynemb_prepare(b, keys[k], HB, DYNEMB_LOOKUP_TRAIN, step, adm[k]));
      for (int i = 0; i < HB; i++) CHECK((hints[k][i] != DYNEMB_NO_HINT) == adm[k][i]);
    }
    int s = step - (AHEAD - 1); /* the step reads batch s */
    if (s < 0) continue;
    int k = s % AHEAD;
    if (s % 7 == 3) { /* rows leave their slots between prepare and read */
      size_t ea = 0, eb = 0;
      CHECK_OK(dynemb_evict(a, step, &ea));
      CHECK_OK(dynemb_evict(b, step, &eb));
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
    CHECK_OK(dynemb_lookup_hinted(a, keys[k], hints[k], HB, oa));
    CHECK_OK(dynemb_lookup_visible(b, keys[k], HB, adm[k], ob));
    CHECK(memcmp(oa, ob, sizeof oa) == 0);
    for (int i = 0; i < HB * HD; i++) g[i] = 0.01f * (float)(i % 5) - 0.02f;
    int64_t allowed[HB];
    size_t na = 0;
    for (int i = 0; i < HB; i++)
      if (adm[k][i]) allowed[na++] = keys[k][i];
    dynemb_apply_stats st_a, st_b;
    CHECK_OK(dynemb_apply_hinted(a, keys[k], hints[k], HB, g, 0.5f, &st_a));
    CHECK_OK(dynemb_apply_filtered(b, keys[k], HB, g, 0.5f, allowed, na, &st_b));
    CHECK(st_a.applied == st_b.applied && st_a.unique_keys == st_b.unique_keys);
    CHECK(st_a.dropped_unknown == st_b.dropped_unknown);
  }
  CHECK(stale_rounds > 3);
  /* made-up hints: no read outside the table (ASan), no error */
  int64_t k2[HB];
  uint64_t junk[HB];
  float o2[HB * HD];
  for (int i = 0; i < HB; i++) {
    rng = rng * 6364136223846793005ULL + 1442695040888963407ULL;
    k2[i] = i;
    junk[i] = rng ^ (rng << 17);
  }
  junk[0] = 0;
  junk[1] = ((uint64_t)3 << 32) | 0xffffffu; /* shard 3, far past its rows */
  CHECK_OK(dynemb_lookup_hinted(a, k2, junk, HB, o2));
  CHECK_RC(dynemb_lookup_hinted(a, k2, NULL, HB, o2), DYNEMB_EINVAL);
  for (int i = 0; i < HB * HD; i++) o2[i] = 0.25f;
  CHECK_OK(dynemb_apply_hinted(a, k2, junk, HB, o2, 0.1f, NULL));
  CHECK_RC(dynemb_apply_hinted(a, k2, NULL, HB, o2, 0.1f, NULL), DYNEMB_EINVAL);
  CHECK_RC(dynemb_apply_hinted(NULL, k2, junk, HB, o2, 0.1f, NULL), DYNEMB_EINVAL);
  CHECK(strstr(dynemb_last_error(), "dynemb_apply_hinted") != NULL);
  CHECK_RC(dynemb_prepare_hints(a, k2, HB, DYNEMB_LOOKUP_TRAIN, 1, NULL), DYNEMB_EINVAL);
  dynemb_table_release(a);
  dynemb_table_release(b);
  dynemb_registry_clear();
}

int main(void) {
  RUN(test_prepare_matches_lookup);
  RUN(test_lookup_visible_masks_rows);
  RUN(test_hints_match_visible);
  return check_summary();
}
