/* dynemb_prepare does to a table exactly what dynemb_lookup does, and its
 * admitted[] says where that lookup returned a row. Reference: a twin table
 * fed the same batches through dynemb_lookup. */
#include <stdint.h>
#include <stdlib.h>

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

int main(void) {
  RUN(test_prepare_matches_lookup);
  RUN(test_lookup_visible_masks_rows);
  return check_summary();
}
