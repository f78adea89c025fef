/*
 * test_serving_export.c -- dynemb_table_export_raw, the files a SavedModel
 * of stock TensorFlow ops serves a table from: against eval lookups of the
 * same table (every exported row bit-identical, the last row the default
 * value that unknown and not-admitted keys read), across several stream
 * blocks and with most rows on the SSD tier; keys ascending in signed
 * order; an empty table; and a write that fails leaves neither file.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "check.h"
#include "ckpt.h"
#include "dynemb.h"

static const char *tmpdir(void) {
  const char *t = getenv("TMPDIR");
  return t && t[0] ? t : "/tmp";
}

/* The whole file, or NULL (size in *n). */
static unsigned char *slurp(const char *path, size_t *n) {
  FILE *f = fopen(path, "rb");
  if (!f) return NULL;
  fseek(f, 0, SEEK_END);
  long sz = ftell(f);
  fseek(f, 0, SEEK_SET);
  unsigned char *buf = malloc((size_t)sz + 1);
  *n = fread(buf, 1, (size_t)sz, f);
  fclose(f);
  return buf;
}

static float le_float(const unsigned char *p) {
  uint32_t u = dynemb_le_get32(p);
  float f;
  memcpy(&f, &u, sizeof f);
  return f;
}

static dynemb_table *make(const char *name, int dim, uint64_t host,
                          uint64_t ssd) {
  dynemb_table_config c;
  dynemb_table_config_init(&c);
  c.name = name;
  c.dim = dim;
  c.init.kind = DYNEMB_INIT_UNIFORM;
  c.init.a = -1;
  c.init.b = 1;
  c.optimizer.kind = DYNEMB_OPT_ADAGRAD; /* slots, which are not exported */
  c.access_threshold = 2;
  c.host_vocabulary_size = host;
  c.ssd_vocabulary_size = ssd;
  c.ssd_data_path = ssd ? tmpdir() : NULL;
  dynemb_table *t = NULL;
  CHECK_OK(dynemb_table_create(&c, &t));
  return t;
}

static void paths(const char *tag, char *keys, char *rows) {
  snprintf(keys, 512, "%s/serving-%s-%d.keys", tmpdir(), tag, (int)getpid());
  snprintf(rows, 512, "%s/serving-%s-%d.rows", tmpdir(), tag, (int)getpid());
}

enum { DIM = 3, KEYS = 9000 }; /* > 2 blocks of 4096 rows */

static void test_rows_equal_eval_lookups(void) {
  dynemb_table *t = make("serve", DIM, 256, KEYS); /* most rows on SSD */
  if (!t) return;
  int64_t *k = malloc(KEYS * sizeof *k);
  float *out = malloc((size_t)KEYS * DIM * sizeof *out);
  for (int i = 0; i < KEYS; i++) k[i] = (int64_t)(i * 2654435761u % 100000) - 50000;
  for (int pass = 0; pass < 2; pass++) /* seen twice: admitted */
    CHECK_OK(
        dynemb_lookup(t, k, KEYS, DYNEMB_LOOKUP_TRAIN, pass, NULL, out, NULL));
  const int64_t once[2] = {777777, -777777}; /* seen once: candidates */
  CHECK_OK(dynemb_lookup(t, once, 2, DYNEMB_LOOKUP_TRAIN, 3, NULL, out, NULL));
  const float dflt[DIM] = {0.5f, -2.0f, 7.25f};
  CHECK_OK(dynemb_table_set_default_value(t, dflt));
  CHECK(dynemb_table_size(t) == KEYS);

  char kp[512], rp[512];
  paths("a", kp, rp);
  uint64_t rows = 0;
  CHECK_OK(dynemb_table_export_raw(t, kp, rp, &rows));
  CHECK(rows == KEYS);
  size_t kn = 0, rn = 0;
  unsigned char *kb = slurp(kp, &kn), *rb = slurp(rp, &rn);
  CHECK(kb && rb);
  CHECK(kn == 8u * KEYS && rn == 4u * DIM * (KEYS + 1));
  if (kb && rb && kn == 8u * KEYS && rn == 4u * DIM * (KEYS + 1)) {
    int64_t *ek = malloc(KEYS * sizeof *ek);
    for (int i = 0; i < KEYS; i++) ek[i] = (int64_t)dynemb_le_get64(kb + 8 * i);
    int ascending = 1;
    for (int i = 1; i < KEYS; i++) ascending &= ek[i - 1] < ek[i];
    CHECK(ascending);
    CHECK_OK(
        dynemb_lookup(t, ek, KEYS, DYNEMB_LOOKUP_EVAL, 4, NULL, out, NULL));
    int same = 1;
    for (size_t i = 0; i < (size_t)KEYS * DIM; i++)
      same &= memcmp(&out[i], &(float){le_float(rb + 4 * i)}, 4) == 0;
    CHECK(same);
    for (int j = 0; j < DIM; j++)
      CHECK(le_float(rb + 4 * ((size_t)KEYS * DIM + j)) == dflt[j]);
    /* what a key without a row reads is that last row */
    CHECK_OK(dynemb_lookup(t, once, 1, DYNEMB_LOOKUP_EVAL, 4, NULL, out, NULL));
    CHECK(memcmp(out, dflt, sizeof dflt) == 0);
    free(ek);
  }
  free(kb);
  free(rb);
  unlink(kp);
  unlink(rp);
  free(k);
  free(out);
  dynemb_table_release(t);
  dynemb_registry_clear();
}

static void test_empty_table(void) {
  dynemb_table *t = make("serve_empty", 2, 0, 0);
  if (!t) return;
  char kp[512], rp[512];
  paths("e", kp, rp);
  uint64_t rows = 99;
  CHECK_OK(dynemb_table_export_raw(t, kp, rp, &rows));
  size_t kn = 1, rn = 0;
  unsigned char *kb = slurp(kp, &kn), *rb = slurp(rp, &rn);
  CHECK(rows == 0 && kb && kn == 0 && rb && rn == 8); /* the default row */
  if (rb && rn == 8) CHECK(le_float(rb) == 0.0f && le_float(rb + 4) == 0.0f);
  free(kb);
  free(rb);
  unlink(kp);
  unlink(rp);
  dynemb_table_release(t);
  dynemb_registry_clear();
}

static void test_failed_write_leaves_nothing(void) {
  dynemb_table *t = make("serve_fail", 2, 0, 0);
  if (!t) return;
  int64_t k[3] = {1, 2, 3};
  float out[6];
  CHECK_OK(dynemb_lookup(t, k, 3, DYNEMB_LOOKUP_TRAIN, 0, NULL, out, NULL));
  char kp[512], rp[512];
  paths("f", kp, rp);
  snprintf(rp, sizeof rp, "%s/no-such-dir-%d/x.rows", tmpdir(), (int)getpid());
  uint64_t rows = 0;
  CHECK(dynemb_table_export_raw(t, kp, rp, &rows) == DYNEMB_EIO);
  CHECK(strstr(dynemb_last_error(), "serve_fail") != NULL &&
        strstr(dynemb_last_error(), "no-such-dir") != NULL);
  struct stat sb;
  char tmp[600];
  snprintf(tmp, sizeof tmp, "%s.tmp-export", kp);
  CHECK(stat(kp, &sb) != 0 && stat(tmp, &sb) != 0);
  CHECK(dynemb_table_export_raw(t, kp, NULL, &rows) == DYNEMB_EINVAL);
  CHECK(dynemb_table_export_raw(NULL, kp, rp, &rows) != DYNEMB_OK);
  dynemb_table_release(t);
  dynemb_registry_clear();
}

int main(void) {
  RUN(test_rows_equal_eval_lookups);
  RUN(test_empty_table);
  RUN(test_failed_write_leaves_nothing);
  return check_summary();
}
