/*
 * test_settings.c -- run-time table settings: the default value returned for
 * keys without a row, and the table clock used for data-time eviction.
 */
#include <stdint.h>
#include <stdlib.h>

#include "check.h"
#include "dynemb.h"

static dynemb_table *make(const char *name, uint32_t admit, int64_t evict) {
  dynemb_table_config c;
  dynemb_table_config_init(&c);
  c.name = name;
  c.dim = 4;
  c.init.kind = DYNEMB_INIT_CONSTANT;
  c.init.a = 0.5f;
  c.access_threshold = admit;
  c.eviction_threshold = evict;
  dynemb_table *t = NULL;
  CHECK_OK(dynemb_table_create(&c, &t));
  return t;
}

static void default_value_is_used_and_replaced(void) {
  dynemb_table *t = make("settings_default", 3, 0);
  const float v[4] = {1, -2, 3, -4};
  float out[8];
  int64_t keys[2] = {7, 8};
  CHECK_OK(dynemb_lookup(t, keys, 2, DYNEMB_LOOKUP_EVAL, 0, NULL, out, NULL));
  for (int i = 0; i < 8; i++) CHECK(out[i] == 0.0f);
  CHECK_OK(dynemb_table_set_default_value(t, v));
  CHECK_OK(dynemb_lookup(t, keys, 2, DYNEMB_LOOKUP_EVAL, 0, NULL, out, NULL));
  for (int i = 0; i < 8; i++) CHECK(out[i] == v[i % 4]);
  /* not admitted yet (threshold 3): the default, in train mode too */
  CHECK_OK(dynemb_lookup(t, keys, 1, DYNEMB_LOOKUP_TRAIN, 1, NULL, out, NULL));
  for (int i = 0; i < 4; i++) CHECK(out[i] == v[i]);
  int64_t three[3] = {7, 7, 7};
  float out3[12];
  CHECK_OK(
      dynemb_lookup(t, three, 3, DYNEMB_LOOKUP_TRAIN, 1, NULL, out3, NULL));
  CHECK(out3[8] == 0.5f); /* admitted at the third sighting: its row */
  CHECK_OK(dynemb_table_set_default_value(t, NULL));
  CHECK_OK(
      dynemb_lookup(t, keys + 1, 1, DYNEMB_LOOKUP_EVAL, 0, NULL, out, NULL));
  for (int i = 0; i < 4; i++) CHECK(out[i] == 0.0f);
  const float bad[4] = {0, NAN, 0, 0};
  CHECK_RC(dynemb_table_set_default_value(t, bad), DYNEMB_EINVAL);
  CHECK(strstr(dynemb_last_error(), "settings_default") != NULL);
  dynemb_table_release(t);
  dynemb_table_drop("settings_default");
}

static void clock_follows_train_lookups_and_imports(void) {
  dynemb_table *t = make("settings_clock", 0, 10);
  float out[4];
  int64_t k = 1, k2 = 2;
  CHECK(dynemb_table_clock(t) == 0);
  CHECK_OK(dynemb_lookup(t, &k, 1, DYNEMB_LOOKUP_TRAIN, 100, NULL, out, NULL));
  CHECK(dynemb_table_clock(t) == 100);
  CHECK_OK(dynemb_lookup(t, &k2, 1, DYNEMB_LOOKUP_TRAIN, 50, NULL, out, NULL));
  CHECK(dynemb_table_clock(t) == 100); /* never goes back */
  CHECK_OK(dynemb_lookup(t, &k, 1, DYNEMB_LOOKUP_EVAL, 500, NULL, out, NULL));
  CHECK(dynemb_table_clock(t) == 100); /* eval does not move it */
  size_t ev = 0;
  /* clock 100, threshold 10: key 2 (stamped 50) goes, key 1 stays */
  CHECK_OK(
      dynemb_evict(t, DYNEMB_NOW_TABLE_CLOCK, DYNEMB_TABLE_THRESHOLD, &ev));
  CHECK(ev == 1);
  CHECK(dynemb_table_size(t) == 1);
  CHECK_OK(dynemb_lookup(t, &k2, 1, DYNEMB_LOOKUP_TRAIN, 200, NULL, out, NULL));
  dynemb_snapshot snap;
  CHECK_OK(dynemb_table_snapshot(t, &snap));
  dynemb_table *u = make("settings_clock2", 0, 10);
  CHECK_OK(dynemb_table_import(u, &snap, DYNEMB_IMPORT_REPLACE, 0, 1));
  CHECK(dynemb_table_clock(u) == 200);
  CHECK_OK(
      dynemb_evict(u, DYNEMB_NOW_TABLE_CLOCK, DYNEMB_TABLE_THRESHOLD, &ev));
  CHECK(ev == 1); /* key 1, stamped 100 */
  dynemb_snapshot_free(&snap);
  dynemb_table_release(t);
  dynemb_table_release(u);
  dynemb_registry_clear();
}

int main(void) {
  RUN(default_value_is_used_and_replaced);
  RUN(clock_follows_train_lookups_and_imports);
  return check_summary();
}
