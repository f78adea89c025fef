/*
 * gen_seeds.c -- writes the fuzz seeds in tests/fuzz/seeds/: two small,
 * valid table files and their MANIFEST, produced by the real writer.
 *
 * libFuzzer mutates from these, so it starts inside the format instead of
 * having to discover the magic number and checksums by chance. The seeds
 * are committed; rerun this after a format change (test_ckpt checks that
 * the committed seeds still read back):
 *
 *   make build/libdynemb.a
 *   cc -std=c11 -D_GNU_SOURCE -Iinclude -Isrc tests/fuzz/gen_seeds.c \
 *      build/libdynemb.a -o build/gen_seeds -lz -lm -pthread
 *   build/gen_seeds tests/fuzz/seeds
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "ckpt.h"
#include "dynemb.h"

static int copy(const char *from, const char *to) {
  FILE *in = fopen(from, "rb"), *out = fopen(to, "wb");
  if (!in || !out) {
    perror(!in ? from : to);
    return 1;
  }
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof buf, in)) > 0) fwrite(buf, 1, n, out);
  fclose(in);
  return fclose(out) != 0;
}

int main(int argc, char **argv) {
  if (argc != 2) {
    fprintf(stderr, "usage: gen_seeds OUTDIR\n");
    return 2;
  }
  /* Adam, dim 2: rows of 6 floats, and two admission candidates. */
  int64_t keys[3] = {-5, 7, 1000000007};
  float values[18];
  for (int i = 0; i < 18; i++) values[i] = 0.25f * (float)(i - 9);
  uint32_t last[3] = {10, 11, 12};
  int64_t ckeys[2] = {3, 4};
  uint32_t ccounts[2] = {1, 2}, clast[2] = {9, 12};
  dynemb_snapshot adam = {.dim = 2, .row_floats = 6,
                          .optimizer_kind = DYNEMB_OPT_ADAM,
                          .apply_steps = 17, .rows = 3, .keys = keys,
                          .values = values, .last_access = last,
                          .candidates = 2, .cand_keys = ckeys,
                          .cand_counts = ccounts, .cand_last_access = clast};
  dynemb_snapshot sgd = {.dim = 1, .row_floats = 1,
                         .optimizer_kind = DYNEMB_OPT_SGD};
  char tmp[] = "/tmp/dynemb-seeds-XXXXXX";
  if (!mkdtemp(tmp)) return 1;
  const char *names[] = {"user/id", "empty"};
  const dynemb_snapshot *snaps[] = {&adam, &sgd};
  if (dynemb_ckpt_save_snapshots(tmp, names, snaps, 2) != DYNEMB_OK) {
    fprintf(stderr, "%s\n", dynemb_last_error());
    return 1;
  }
  /* Sorted by name: "empty" is g000001-t0001, "user/id" g000001-t0000. */
  char from[256], to[1024];
  int rc = 0;
  snprintf(from, sizeof from, "%s/g000001-t0000.dtab", tmp);
  snprintf(to, sizeof to, "%s/table_adam.dtab", argv[1]);
  rc |= copy(from, to);
  unlink(from);
  snprintf(from, sizeof from, "%s/g000001-t0001.dtab", tmp);
  snprintf(to, sizeof to, "%s/table_sgd_empty.dtab", argv[1]);
  rc |= copy(from, to);
  unlink(from);
  snprintf(from, sizeof from, "%s/MANIFEST", tmp);
  snprintf(to, sizeof to, "%s/MANIFEST", argv[1]);
  rc |= copy(from, to);
  unlink(from);
  rmdir(tmp);
  return rc;
}
