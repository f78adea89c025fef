/*
 * test_ckpt.c -- checkpoints: format round trips, damage detection, crash
 * safety of save, and loading into real tables.
 *
 * A checkpoint is only useful if (1) it gives back exactly what was saved,
 * (2) any damage is reported instead of loaded, and (3) a crash during save
 * never destroys the previous checkpoint. The tests check each directly:
 *
 *  - format layer: snapshots built here by hand (odd names, empty tables,
 *    NaN / -0.0 values, multi-megabyte sections crossing the streaming
 *    block) are saved through the internal seam dynemb_ckpt_save_snapshots
 *    and read back bit for bit with dynemb_checkpoint_read;
 *  - damage: every byte of a small checkpoint flipped one at a time, many
 *    random multi-byte corruptions, truncation at every length, a valid
 *    file of a future format version (its CRCs recomputed here with zlib,
 *    an independent reference) -> ECORRUPT / EVERSION with the file named;
 *  - crash safety: a forked child saves with crash injection set to stop it
 *    (SIGKILL) at each I/O operation in turn; the parent then checks the
 *    directory verifies and holds either the old or the new checkpoint
 *    entirely, and that the next save removes the leftovers;
 *  - tables: train real tables (rows, optimizer slots, admission
 *    candidates, last access), save, load into fresh tables and compare
 *    snapshots; shard-filtered loads partition the keys exactly; loads
 *    under another name; EMBEDDING_ONLY into another optimizer; wrong dim;
 *    AdamW's slots, and an Adam table refusing them;
 *    a damaged file leaves the target table unchanged.
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>
#include <zlib.h>

#include "check.h"
#include "ckpt.h"
#include "dynemb.h"

/* ---- helpers ------------------------------------------------------------- */

static uint64_t rng_state = 0x1234567887654321ULL;

static uint64_t rnd(void) {
  uint64_t z = (rng_state += 0x9e3779b97f4a7c15ULL);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

static char base_dir[512];

/* A fresh empty directory under the test's base directory. */
static void fresh_dir(char *out, size_t n, const char *tag) {
  static int counter;
  snprintf(out, n, "%s/%s-%d", base_dir, tag, counter++);
  mkdir(out, 0755);
}

static void rm_tree(const char *dir) {
  DIR *d = opendir(dir);
  if (!d) return;
  struct dirent *de;
  char path[1024];
  while ((de = readdir(d)) != NULL) {
    if (!strcmp(de->d_name, ".") || !strcmp(de->d_name, "..")) continue;
    snprintf(path, sizeof path, "%s/%s", dir, de->d_name);
    struct stat st;
    if (lstat(path, &st) == 0 && S_ISDIR(st.st_mode))
      rm_tree(path);
    else
      unlink(path);
  }
  closedir(d);
  rmdir(dir);
}

static unsigned char *read_bytes(const char *path, size_t *n) {
  *n = 0;
  FILE *f = fopen(path, "rb");
  if (!f) return NULL;
  fseek(f, 0, SEEK_END);
  long len = ftell(f);
  fseek(f, 0, SEEK_SET);
  unsigned char *buf = malloc((size_t)len + 1);
  if (fread(buf, 1, (size_t)len, f) != (size_t)len) len = 0;
  fclose(f);
  *n = (size_t)len;
  return buf;
}

/* Rewrites a file in place (no truncation to zero first: on ext4 that
 * makes close() flush to disk, which would make these tests slow). */
static void write_bytes(const char *path, const void *p, size_t n) {
  int fd = open(path, O_WRONLY | O_CREAT, 0644);
  if (fd < 0) return;
  if (pwrite(fd, p, n, 0) != (ssize_t)n || ftruncate(fd, (off_t)n) != 0)
    fprintf(stderr, "rewriting %s failed\n", path);
  close(fd);
}

/* Number of directory entries other than . and .. */
static int count_files(const char *dir) {
  DIR *d = opendir(dir);
  if (!d) return -1;
  int n = 0;
  struct dirent *de;
  while ((de = readdir(d)) != NULL)
    if (strcmp(de->d_name, ".") && strcmp(de->d_name, "..")) n++;
  closedir(d);
  return n;
}

static int file_exists(const char *dir, const char *name) {
  char path[1024];
  snprintf(path, sizeof path, "%s/%s", dir, name);
  struct stat st;
  return stat(path, &st) == 0;
}

static int slots_of(int kind) {
  return kind == DYNEMB_OPT_SGD ? 0 : kind == DYNEMB_OPT_ADAGRAD ? 1 : 2;
}

/* A hand-built snapshot with sorted unique keys (negative and extreme ones
 * included) and arbitrary float bit patterns (NaN, -0.0, inf, denormals). */
static dynemb_snapshot make_snap(int dim, int kind, size_t rows,
                                 size_t cands) {
  dynemb_snapshot s;
  memset(&s, 0, sizeof s);
  s.dim = dim;
  s.optimizer_kind = kind;
  s.row_floats = dim * (1 + slots_of(kind));
  s.apply_steps = rnd() >> 20;
  s.rows = rows;
  s.candidates = cands;
  s.keys = malloc((rows + 1) * sizeof(int64_t));
  s.values = malloc((rows * (size_t)s.row_floats + 1) * sizeof(float));
  s.last_access = malloc((rows + 1) * sizeof(uint32_t));
  s.cand_keys = malloc((cands + 1) * sizeof(int64_t));
  s.cand_counts = malloc((cands + 1) * sizeof(uint32_t));
  s.cand_last_access = malloc((cands + 1) * sizeof(uint32_t));
  int64_t k = rows ? INT64_MIN : 0;
  for (size_t i = 0; i < rows; i++) {
    s.keys[i] = k;
    k += 1 + (int64_t)(rnd() % 1000000007ULL) * (i == 0 ? 1 : 1000);
    s.last_access[i] = (uint32_t)rnd();
  }
  for (size_t i = 0; i < rows * (size_t)s.row_floats; i++) {
    uint32_t bits = (uint32_t)rnd();
    switch (i % 7) {
    case 0: bits = 0x7fc00001u; break; /* a NaN with payload */
    case 1: bits = 0x80000000u; break; /* -0.0 */
    case 2: bits = 0x7f800000u; break; /* inf */
    default: break;
    }
    memcpy(&s.values[i], &bits, 4);
  }
  int64_t c = -(int64_t)(cands * 3);
  for (size_t i = 0; i < cands; i++) {
    s.cand_keys[i] = c;
    c += 1 + (int64_t)(rnd() % 5);
    s.cand_counts[i] = 1 + (uint32_t)(rnd() % 100);
    s.cand_last_access[i] = (uint32_t)rnd();
  }
  return s;
}

static void free_snap(dynemb_snapshot *s) { dynemb_snapshot_free(s); }

/* Bitwise equality of two snapshots. */
static int snap_equal(const dynemb_snapshot *a, const dynemb_snapshot *b) {
  if (a->dim != b->dim || a->row_floats != b->row_floats ||
      a->optimizer_kind != b->optimizer_kind ||
      a->apply_steps != b->apply_steps || a->rows != b->rows ||
      a->candidates != b->candidates)
    return 0;
#define SAME(f, n) ((n) == 0 || memcmp(a->f, b->f, (n) * sizeof *a->f) == 0)
  return SAME(keys, a->rows) &&
         SAME(values, a->rows * (size_t)a->row_floats) &&
         SAME(last_access, a->rows) && SAME(cand_keys, a->candidates) &&
         SAME(cand_counts, a->candidates) &&
         SAME(cand_last_access, a->candidates);
#undef SAME
}

static int save_snaps(const char *dir, const char **names,
                      const dynemb_snapshot **snaps, size_t n) {
  return dynemb_ckpt_save_snapshots(dir, names, snaps, n);
}

/* Reads table `name` of `dir` and compares with `want`. */
static int read_equals(const char *dir, const char *name,
                       const dynemb_snapshot *want) {
  dynemb_snapshot got;
  int rc = dynemb_checkpoint_read(dir, name, &got);
  if (rc) {
    fprintf(stderr, "read '%s' failed: %s\n", name, dynemb_last_error());
    return 0;
  }
  int eq = snap_equal(&got, want);
  free_snap(&got);
  return eq;
}

/* The file the MANIFEST names for `name` (via inspect). */
static int file_of(const char *dir, const char *name, char *out, size_t n) {
  dynemb_ckpt_entry *e;
  size_t cnt;
  if (dynemb_checkpoint_inspect(dir, &e, &cnt)) return 0;
  int found = 0;
  for (size_t i = 0; i < cnt; i++)
    if (!strcmp(e[i].name, name)) {
      snprintf(out, n, "%s/%s", dir, e[i].file);
      found = 1;
    }
  dynemb_ckpt_entries_free(e, cnt);
  return found;
}

static int contains(const char *hay, const char *needle) {
  return strstr(hay, needle) != NULL;
}

/* ---- format layer (hand-built snapshots) --------------------------------- */

static void test_format_roundtrip(void) {
  char dir[600];
  fresh_dir(dir, sizeof dir, "roundtrip");
  dynemb_snapshot a = make_snap(3, DYNEMB_OPT_ADAM, 50, 7);
  dynemb_snapshot b = make_snap(1, DYNEMB_OPT_SGD, 0, 0);
  dynemb_snapshot c = make_snap(5, DYNEMB_OPT_FTRL, 9, 0);
  dynemb_snapshot d = make_snap(2, DYNEMB_OPT_ADAGRAD, 0, 4);
  const char *names[] = {"user_id", "empty",
                         "a/b c\nd%e\t\xc3\xa9../..", "cands only"};
  const dynemb_snapshot *snaps[] = {&a, &b, &c, &d};
  CHECK_OK(save_snaps(dir, names, snaps, 4));
  for (int i = 0; i < 4; i++) CHECK(read_equals(dir, names[i], snaps[i]));
  CHECK_OK(dynemb_checkpoint_verify(dir));
  CHECK(count_files(dir) == 5); /* MANIFEST + 4 tables, no temporaries */

  dynemb_ckpt_entry *e = NULL;
  size_t n = 0;
  CHECK_OK(dynemb_checkpoint_inspect(dir, &e, &n));
  CHECK(n == 4);
  for (size_t i = 0; i < n; i++) {
    int j = -1;
    for (int k = 0; k < 4; k++)
      if (!strcmp(e[i].name, names[k])) j = k;
    CHECK(j >= 0);
    if (j < 0) continue;
    CHECK(strchr(e[i].file, '/') == NULL);
    CHECK(e[i].format_version == DYNEMB_CKPT_FORMAT_VERSION);
    CHECK(e[i].dim == snaps[j]->dim);
    CHECK(e[i].row_floats == snaps[j]->row_floats);
    CHECK(e[i].optimizer_kind == snaps[j]->optimizer_kind);
    CHECK(e[i].rows == snaps[j]->rows);
    CHECK(e[i].candidates == snaps[j]->candidates);
    CHECK(e[i].apply_steps == snaps[j]->apply_steps);
    /* Independent size formula from docs/checkpoint-format.md. */
    uint64_t want = 68 + strlen(names[j]) + 6 * 20 +
                    snaps[j]->rows * (12 + 4 * (uint64_t)snaps[j]->row_floats) +
                    snaps[j]->candidates * 16;
    CHECK(e[i].file_bytes == want);
    char path[1024];
    snprintf(path, sizeof path, "%s/%s", dir, e[i].file);
    struct stat st;
    CHECK(stat(path, &st) == 0 && (uint64_t)st.st_size == want);
  }
  dynemb_ckpt_entries_free(e, n);
  free_snap(&a);
  free_snap(&b);
  free_snap(&c);
  free_snap(&d);
}

/* Files known from the spec: magic, little-endian fields, CRC32 of the
 * header, checked here byte by byte with zlib as the reference. */
static void test_format_bytes(void) {
  char dir[600], path[1024];
  fresh_dir(dir, sizeof dir, "bytes");
  dynemb_snapshot a = make_snap(2, DYNEMB_OPT_ADAGRAD, 2, 1);
  a.apply_steps = 0x0102030405060708ULL;
  const char *names[] = {"t"};
  const dynemb_snapshot *snaps[] = {&a};
  CHECK_OK(save_snaps(dir, names, snaps, 1));
  CHECK(file_of(dir, "t", path, sizeof path));
  size_t n;
  unsigned char *f = read_bytes(path, &n);
  CHECK(f != NULL && n == 68 + 1 + 120 + 2 * (12 + 16) + 16);
  if (f && n > 100) {
    static const unsigned char magic[8] = {0x89, 'D', 'Y', 'N',
                                           'T', 'A', 'B', '\n'};
    CHECK(memcmp(f, magic, 8) == 0);
    CHECK(f[8] == 1 && f[9] == 0 && f[10] == 0 && f[11] == 0); /* version */
    CHECK(f[12] == 69 && f[13] == 0);                          /* hdr bytes */
    CHECK(f[16] == 2 && f[20] == 4 && f[24] == DYNEMB_OPT_ADAGRAD);
    CHECK(f[32] == 0x08 && f[39] == 0x01); /* apply_steps little-endian */
    CHECK(f[40] == 2 && f[48] == 1 && f[56] == 6 && f[60] == 1);
    CHECK(f[64] == 't');
    uint32_t hcrc = (uint32_t)crc32(0L, f, 65);
    CHECK(f[65] == (hcrc & 0xff) && f[68] == hcrc >> 24);
    /* First section: keys, id 1, 8-byte elements, count 2. */
    CHECK(f[69] == 1 && f[73] == 8 && f[77] == 2);
    uint64_t k0 = 0;
    for (int i = 7; i >= 0; i--) k0 = k0 << 8 | f[85 + i];
    CHECK((int64_t)k0 == a.keys[0]);
    uint32_t scrc = (uint32_t)crc32(0L, f + 69, 16 + 16);
    uint32_t stored = (uint32_t)f[101] | (uint32_t)f[102] << 8 |
                      (uint32_t)f[103] << 16 | (uint32_t)f[104] << 24;
    CHECK(scrc == stored);
  }
  free(f);
  /* The MANIFEST: text, checksum over everything before the last line. */
  snprintf(path, sizeof path, "%s/MANIFEST", dir);
  f = read_bytes(path, &n);
  CHECK(f != NULL && n > 30);
  if (f && n > 30) {
    CHECK(memcmp(f, "dynemb-checkpoint-manifest 1\ngeneration 1\ntable t ",
                 50) == 0);
    size_t ls = n - 1;
    while (ls > 0 && f[ls - 1] != '\n') ls--;
    char want[32];
    snprintf(want, sizeof want, "checksum %08x\n",
             (unsigned)crc32(0L, f, (uInt)ls));
    CHECK(n - ls == strlen(want) && memcmp(f + ls, want, n - ls) == 0);
  }
  free(f);
  free_snap(&a);
}

static void test_format_large_streaming(void) {
  char dir[600];
  fresh_dir(dir, sizeof dir, "large");
  /* keys section > 1 MiB block (140k keys), values 3 MiB in one table. */
  dynemb_snapshot a = make_snap(1, DYNEMB_OPT_SGD, 140000, 140000);
  dynemb_snapshot b = make_snap(64, DYNEMB_OPT_ADAM, 4000, 3);
  const char *names[] = {"wide_keys", "wide_rows"};
  const dynemb_snapshot *snaps[] = {&a, &b};
  CHECK_OK(save_snaps(dir, names, snaps, 2));
  CHECK(read_equals(dir, "wide_keys", &a));
  CHECK(read_equals(dir, "wide_rows", &b));
  CHECK_OK(dynemb_checkpoint_verify(dir));
  free_snap(&a);
  free_snap(&b);
}

static void test_manifest_keeps_and_cleans(void) {
  char dir[600], fa[1024], fb[1024], fa2[1024], fb2[1024], p[1024];
  fresh_dir(dir, sizeof dir, "keep");
  dynemb_snapshot a = make_snap(2, DYNEMB_OPT_SGD, 5, 1);
  dynemb_snapshot b = make_snap(2, DYNEMB_OPT_SGD, 6, 2);
  dynemb_snapshot b2 = make_snap(2, DYNEMB_OPT_SGD, 7, 0);
  const char *n1[] = {"A", "B"};
  const dynemb_snapshot *s1[] = {&a, &b};
  CHECK_OK(save_snaps(dir, n1, s1, 2));
  CHECK(file_of(dir, "A", fa, sizeof fa) && file_of(dir, "B", fb, sizeof fb));
  /* Leftovers of crashed saves, and a file that is not ours. */
  const char *stale[] = {"g000099-t0000.dtab.tmp", "g000050-t0001.dtab",
                         "MANIFEST.tmp"};
  for (int i = 0; i < 3; i++) {
    snprintf(p, sizeof p, "%s/%s", dir, stale[i]);
    write_bytes(p, "x", 1);
  }
  snprintf(p, sizeof p, "%s/notes.txt", dir);
  write_bytes(p, "mine", 4);
  const char *n2[] = {"B"};
  const dynemb_snapshot *s2[] = {&b2};
  CHECK_OK(save_snaps(dir, n2, s2, 1));
  CHECK(read_equals(dir, "A", &a));  /* kept, same file */
  CHECK(read_equals(dir, "B", &b2)); /* replaced */
  CHECK(file_of(dir, "A", fa2, sizeof fa2) && !strcmp(fa, fa2));
  CHECK(file_of(dir, "B", fb2, sizeof fb2) && strcmp(fb, fb2) != 0);
  struct stat st;
  CHECK(stat(fb, &st) != 0); /* old generation's file is gone */
  for (int i = 0; i < 3; i++) CHECK(!file_exists(dir, stale[i]));
  CHECK(file_exists(dir, "notes.txt"));
  CHECK(count_files(dir) == 4); /* MANIFEST, A, B, notes.txt */
  /* An empty save keeps everything. */
  CHECK_OK(save_snaps(dir, NULL, NULL, 0));
  CHECK(read_equals(dir, "A", &a) && read_equals(dir, "B", &b2));
  free_snap(&a);
  free_snap(&b);
  free_snap(&b2);
}

static void test_errors(void) {
  char dir[600], p[1024];
  fresh_dir(dir, sizeof dir, "errors");
  dynemb_snapshot a = make_snap(2, DYNEMB_OPT_SGD, 5, 1);
  const char *names[] = {"alpha", "beta"};
  const dynemb_snapshot *s[] = {&a, &a};
  CHECK_OK(save_snaps(dir, names, s, 2));

  dynemb_snapshot got;
  CHECK_RC(dynemb_checkpoint_read(dir, "gamma", &got), DYNEMB_ENOTFOUND);
  CHECK(contains(dynemb_last_error(), "'gamma'"));
  CHECK(contains(dynemb_last_error(), "'alpha'"));
  CHECK(contains(dynemb_last_error(), "'beta'"));

  const char *dup[] = {"x", "x"};
  CHECK_RC(save_snaps(dir, dup, s, 2), DYNEMB_EINVAL);
  CHECK(contains(dynemb_last_error(), "twice"));

  /* Unsorted keys are refused, and the checkpoint stays as it was. */
  dynemb_snapshot bad = make_snap(2, DYNEMB_OPT_SGD, 5, 0);
  bad.keys[3] = bad.keys[1];
  const char *n1[] = {"alpha"};
  const dynemb_snapshot *s1[] = {&bad};
  CHECK_RC(save_snaps(dir, n1, s1, 1), DYNEMB_EINVAL);
  CHECK(read_equals(dir, "alpha", &a));
  CHECK(count_files(dir) == 3);
  bad.row_floats = 3;
  CHECK_RC(save_snaps(dir, n1, s1, 1), DYNEMB_EINVAL);

  /* Missing directory, a file instead of a directory. */
  snprintf(p, sizeof p, "%s/nope", dir);
  CHECK_RC(dynemb_checkpoint_read(p, "alpha", &got), DYNEMB_EIO);
  CHECK(contains(dynemb_last_error(), p));
  CHECK_RC(dynemb_checkpoint_verify(p), DYNEMB_EIO);
  snprintf(p, sizeof p, "%s/MANIFEST", dir);
  CHECK_RC(save_snaps(p, n1, s, 1), DYNEMB_EIO);
  /* Nested directories are created. */
  snprintf(p, sizeof p, "%s/x/y/z", dir);
  CHECK_OK(save_snaps(p, n1, s, 1));
  CHECK(read_equals(p, "alpha", &a));
  /* A file the MANIFEST names is missing. */
  char fa[1024];
  CHECK(file_of(dir, "beta", fa, sizeof fa));
  unlink(fa);
  CHECK_RC(dynemb_checkpoint_verify(dir), DYNEMB_ECORRUPT);
  CHECK(contains(dynemb_last_error(), "missing"));
  CHECK(read_equals(dir, "alpha", &a));
  free_snap(&a);
  free_snap(&bad);
}

/* Every single-byte change in either file is detected by read and verify,
 * and the message names the damaged file. */
static void test_corrupt_every_byte(void) {
  char dir[600], ft[1024], fm[1024];
  fresh_dir(dir, sizeof dir, "flip");
  dynemb_snapshot a = make_snap(2, DYNEMB_OPT_ADAM, 3, 2);
  dynemb_snapshot b = make_snap(1, DYNEMB_OPT_SGD, 1, 0);
  const char *names[] = {"user_id", "other"};
  const dynemb_snapshot *s[] = {&a, &b};
  CHECK_OK(save_snaps(dir, names, s, 2));
  CHECK(file_of(dir, "user_id", ft, sizeof ft));
  snprintf(fm, sizeof fm, "%s/MANIFEST", dir);
  const char *files[] = {ft, fm};
  static const unsigned char masks[] = {0x01, 0x80, 0xff, 0x10};
  int bad = 0;
  for (int fi = 0; fi < 2; fi++) {
    size_t n = 0;
    unsigned char *orig = read_bytes(files[fi], &n);
    unsigned char *buf = malloc(n);
    const char *base = strrchr(files[fi], '/') + 1;
    for (size_t pos = 0; pos < n; pos++) {
      for (size_t m = 0; m < sizeof masks; m++) {
        memcpy(buf, orig, n);
        buf[pos] ^= masks[m];
        write_bytes(files[fi], buf, n);
        dynemb_snapshot got;
        int rc = dynemb_checkpoint_read(dir, "user_id", &got);
        int rc2 = dynemb_checkpoint_verify(dir);
        int named = contains(dynemb_last_error(), base);
        if (rc != DYNEMB_ECORRUPT || rc2 != DYNEMB_ECORRUPT || !named) {
          if (bad++ < 5)
            fprintf(stderr, "file %s byte %zu ^%02x: read %d verify %d: %s\n",
                    base, pos, masks[m], rc, rc2, dynemb_last_error());
        }
        if (rc == DYNEMB_OK) free_snap(&got);
      }
    }
    write_bytes(files[fi], orig, n);
    free(orig);
    free(buf);
  }
  CHECK(bad == 0);
  CHECK(read_equals(dir, "user_id", &a));
  CHECK(read_equals(dir, "other", &b));
  free_snap(&a);
  free_snap(&b);
}

static void test_corrupt_random(void) {
  char dir[600], ft[1024];
  fresh_dir(dir, sizeof dir, "random");
  dynemb_snapshot a = make_snap(4, DYNEMB_OPT_FTRL, 200, 50);
  const char *names[] = {"t"};
  const dynemb_snapshot *s[] = {&a};
  CHECK_OK(save_snaps(dir, names, s, 1));
  CHECK(file_of(dir, "t", ft, sizeof ft));
  size_t n;
  unsigned char *orig = read_bytes(ft, &n);
  unsigned char *buf = malloc(n);
  int bad = 0;
  for (int trial = 0; trial < 300; trial++) {
    memcpy(buf, orig, n);
    int changes = 1 + (int)(rnd() % 8);
    for (int c = 0; c < changes; c++) {
      size_t pos = (size_t)(rnd() % n);
      buf[pos] = (unsigned char)(buf[pos] ^ (1 + rnd() % 255));
    }
    if (!memcmp(buf, orig, n)) continue; /* two changes cancelled out */
    write_bytes(ft, buf, n);
    dynemb_snapshot got;
    int rc = dynemb_checkpoint_read(dir, "t", &got);
    if (rc != DYNEMB_ECORRUPT && bad++ < 5)
      fprintf(stderr, "trial %d: read %d: %s\n", trial, rc,
              dynemb_last_error());
    if (rc == DYNEMB_OK) free_snap(&got);
    /* The reader alone (no MANIFEST size/CRC to lean on) must reject it. */
    dynemb_ckpt_src src;
    dynemb_ckpt_src_mem(&src, buf, n);
    rc = dynemb_ckpt_table_read(&src, "mem", NULL, NULL);
    if (rc != DYNEMB_ECORRUPT && rc != DYNEMB_EVERSION && bad++ < 5)
      fprintf(stderr, "trial %d: mem read %d\n", trial, rc);
  }
  CHECK(bad == 0);
  write_bytes(ft, orig, n);
  CHECK(read_equals(dir, "t", &a));
  free(orig);
  free(buf);
  free_snap(&a);
}

static void test_truncated_every_length(void) {
  char dir[600], ft[1024], fm[1024];
  fresh_dir(dir, sizeof dir, "trunc");
  dynemb_snapshot a = make_snap(3, DYNEMB_OPT_ADAGRAD, 4, 3);
  const char *names[] = {"t"};
  const dynemb_snapshot *s[] = {&a};
  CHECK_OK(save_snaps(dir, names, s, 1));
  CHECK(file_of(dir, "t", ft, sizeof ft));
  snprintf(fm, sizeof fm, "%s/MANIFEST", dir);
  int bad = 0;
  const char *files[] = {ft, fm};
  for (int fi = 0; fi < 2; fi++) {
    size_t n = 0;
    unsigned char *orig = read_bytes(files[fi], &n);
    for (size_t len = 0; len <= n + 1; len++) {
      if (len == n) continue;
      unsigned char *buf = malloc(n + 2);
      memcpy(buf, orig, n);
      buf[n] = '\n';
      buf[n + 1] = 0;
      write_bytes(files[fi], buf, len);
      dynemb_snapshot got;
      int rc = dynemb_checkpoint_read(dir, "t", &got);
      int rc2 = dynemb_checkpoint_verify(dir);
      if ((rc != DYNEMB_ECORRUPT || rc2 != DYNEMB_ECORRUPT) && bad++ < 5)
        fprintf(stderr, "file %d len %zu/%zu: read %d verify %d: %s\n", fi,
                len, n, rc, rc2, dynemb_last_error());
      if (rc == DYNEMB_OK) free_snap(&got);
      if (fi == 0) { /* the reader alone, from memory */
        dynemb_ckpt_src src;
        dynemb_ckpt_src_mem(&src, buf, len);
        rc = dynemb_ckpt_table_read(&src, "mem", NULL, &got);
        if (rc != DYNEMB_ECORRUPT && bad++ < 5)
          fprintf(stderr, "mem len %zu: %d\n", len, rc);
        if (rc == DYNEMB_OK) free_snap(&got);
      }
      free(buf);
    }
    write_bytes(files[fi], orig, n);
    free(orig);
  }
  CHECK(bad == 0);
  CHECK(read_equals(dir, "t", &a));
  free_snap(&a);
}

static void put32(unsigned char *p, uint32_t v) {
  for (int i = 0; i < 4; i++) p[i] = (unsigned char)(v >> (8 * i));
}

/* A well-formed file of a future format version is EVERSION, naming both
 * versions; so is a MANIFEST of a future version. */
static void test_future_version(void) {
  char dir[600], ft[1024], fm[1024];
  fresh_dir(dir, sizeof dir, "version");
  dynemb_snapshot a = make_snap(2, DYNEMB_OPT_SGD, 3, 0);
  const char *names[] = {"t"};
  const dynemb_snapshot *s[] = {&a};
  CHECK_OK(save_snaps(dir, names, s, 1));
  CHECK(file_of(dir, "t", ft, sizeof ft));
  size_t n;
  unsigned char *orig = read_bytes(ft, &n);
  unsigned char *buf = malloc(n);
  memcpy(buf, orig, n);
  put32(buf + 8, 2);
  uint32_t hb = (uint32_t)buf[12] | (uint32_t)buf[13] << 8;
  put32(buf + hb - 4, (uint32_t)crc32(0L, buf, hb - 4));
  write_bytes(ft, buf, n);
  dynemb_snapshot got;
  CHECK_RC(dynemb_checkpoint_read(dir, "t", &got), DYNEMB_EVERSION);
  CHECK(contains(dynemb_last_error(), "version 2"));
  CHECK(contains(dynemb_last_error(), "version 1"));
  CHECK_RC(dynemb_checkpoint_verify(dir), DYNEMB_EVERSION);
  dynemb_ckpt_entry *e;
  size_t cnt;
  CHECK_RC(dynemb_checkpoint_inspect(dir, &e, &cnt), DYNEMB_EVERSION);
  write_bytes(ft, orig, n);
  free(orig);
  free(buf);

  snprintf(fm, sizeof fm, "%s/MANIFEST", dir);
  unsigned char *m = read_bytes(fm, &n);
  /* Rewrite "...manifest 1" as "...manifest 3" (2 is an incremental
   * checkpoint's) and fix the checksum. */
  char *text = malloc(n + 1);
  memcpy(text, m, n);
  text[n] = 0;
  char *one = strchr(text, '\n') - 1;
  *one = '3';
  char *last = text + n - 1;
  while (last > text && last[-1] != '\n') last--;
  snprintf(last, 32, "checksum %08x\n",
           (unsigned)crc32(0L, (unsigned char *)text, (uInt)(last - text)));
  write_bytes(fm, text, strlen(text));
  CHECK_RC(dynemb_checkpoint_read(dir, "t", &got), DYNEMB_EVERSION);
  CHECK(contains(dynemb_last_error(), "MANIFEST"));
  CHECK_RC(dynemb_checkpoint_verify(dir), DYNEMB_EVERSION);
  /* Save refuses to overwrite a MANIFEST it cannot read. */
  CHECK_RC(save_snaps(dir, names, s, 1), DYNEMB_EVERSION);
  write_bytes(fm, m, n);
  CHECK(read_equals(dir, "t", &a));
  free(m);
  free(text);
  free_snap(&a);
}

/* Crash injection: stop a save at every I/O operation in turn. */
static void test_crash_during_save(void) {
  dynemb_snapshot a = make_snap(3, DYNEMB_OPT_ADAM, 20, 4);
  dynemb_snapshot b = make_snap(2, DYNEMB_OPT_SGD, 5, 0);
  dynemb_snapshot a2 = make_snap(3, DYNEMB_OPT_ADAM, 30000, 5); /* 2.9 MB */
  dynemb_snapshot c = make_snap(4, DYNEMB_OPT_FTRL, 7, 1);
  const char *n1[] = {"A", "B"}, *n2[] = {"A", "C"};
  const dynemb_snapshot *s1[] = {&a, &b}, *s2[] = {&a2, &c};

  /* How many fault units a full save spends (measured in-process). */
  char dir[600];
  fresh_dir(dir, sizeof dir, "crash-measure");
  CHECK_OK(save_snaps(dir, n1, s1, 2));
  dynemb_ckpt_fault_budget = 1000000;
  CHECK_OK(save_snaps(dir, n2, s2, 2));
  long total = 1000000 - dynemb_ckpt_fault_budget;
  dynemb_ckpt_fault_budget = -1;
  CHECK(total >= 12 && total < 100);

  int bad = 0, old_seen = 0, new_seen = 0;
  for (long k = 0; k <= total; k++) {
    fresh_dir(dir, sizeof dir, "crash");
    CHECK_OK(save_snaps(dir, n1, s1, 2));
    fflush(NULL);
    pid_t pid = fork();
    if (pid == 0) {
      dynemb_ckpt_fault_budget = k;
      int rc = save_snaps(dir, n2, s2, 2);
      _exit(rc == DYNEMB_OK ? 0 : 1);
    }
    int status = 0;
    waitpid(pid, &status, 0);
    int killed = WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL;
    int finished = WIFEXITED(status) && WEXITSTATUS(status) == 0;
    if (!(k < total ? killed : finished)) {
      fprintf(stderr, "crash point %ld: unexpected status 0x%x\n", k, status);
      bad++;
    }
    if (dynemb_checkpoint_verify(dir) != DYNEMB_OK) {
      fprintf(stderr, "crash point %ld: verify: %s\n", k, dynemb_last_error());
      bad++;
      continue;
    }
    int is_new = read_equals(dir, "A", &a2);
    int is_old = !is_new && read_equals(dir, "A", &a);
    dynemb_snapshot got;
    int rc_c = dynemb_checkpoint_read(dir, "C", &got);
    if (rc_c == DYNEMB_OK) free_snap(&got);
    if (!(is_old || is_new) || !read_equals(dir, "B", &b) ||
        (is_new ? !read_equals(dir, "C", &c) : rc_c != DYNEMB_ENOTFOUND)) {
      fprintf(stderr, "crash point %ld: neither old nor new checkpoint\n", k);
      bad++;
    }
    old_seen += is_old;
    new_seen += is_new;
    /* The next save succeeds and leaves only referenced files. */
    const char *n3[] = {"C"};
    const dynemb_snapshot *s3[] = {&c};
    CHECK_OK(save_snaps(dir, n3, s3, 1));
    if (count_files(dir) != 4) { /* MANIFEST, A, B, C */
      fprintf(stderr, "crash point %ld: %d files after the next save\n", k,
              count_files(dir));
      bad++;
    }
  }
  CHECK(bad == 0);
  CHECK(old_seen > 0 && new_seen > 0);
  free_snap(&a);
  free_snap(&b);
  free_snap(&a2);
  free_snap(&c);
}

/* Threads saving different tables into one directory at once: saves are
 * serialized by the directory lock and each keeps the others' tables, so
 * every table survives. Readers run meanwhile and always see a complete
 * checkpoint. */
enum { SAVERS = 4 };
typedef struct saver_arg {
  const char *dir;
  const char *name;
  const dynemb_snapshot *snap;
  int failures;
} saver_arg;

static void *saver_main(void *p) {
  saver_arg *a = p;
  for (int i = 0; i < 5; i++) {
    const char *names[] = {a->name};
    const dynemb_snapshot *snaps[] = {a->snap};
    if (save_snaps(a->dir, names, snaps, 1) != DYNEMB_OK) a->failures++;
    if (dynemb_checkpoint_verify(a->dir) != DYNEMB_OK) a->failures++;
  }
  return NULL;
}

static void test_concurrent_saves(void) {
  char dir[600];
  fresh_dir(dir, sizeof dir, "concurrent");
  dynemb_snapshot snaps[SAVERS];
  saver_arg args[SAVERS];
  pthread_t th[SAVERS];
  static const char *names[SAVERS] = {"t0", "t1", "t2", "t3"};
  for (int i = 0; i < SAVERS; i++) {
    snaps[i] = make_snap(2 + i, i % 4, 100 * (size_t)(i + 1), 3);
    args[i] = (saver_arg){dir, names[i], &snaps[i], 0};
  }
  for (int i = 0; i < SAVERS; i++)
    pthread_create(&th[i], NULL, saver_main, &args[i]);
  for (int i = 0; i < SAVERS; i++) pthread_join(th[i], NULL);
  for (int i = 0; i < SAVERS; i++) {
    CHECK(args[i].failures == 0);
    CHECK(read_equals(dir, names[i], &snaps[i]));
    free_snap(&snaps[i]);
  }
  CHECK(count_files(dir) == SAVERS + 1);
}

/* The committed fuzz seeds are valid files of the current format. */
static void test_fuzz_seeds_valid(void) {
  const char *seeds[] = {"tests/fuzz/seeds/table_adam.dtab",
                         "tests/fuzz/seeds/table_sgd_empty.dtab",
                         "tests/fuzz/seeds/MANIFEST",
                         "tests/fuzz/seeds/MANIFEST.delta"};
  for (int i = 0; i < 4; i++) {
    size_t n = 0;
    unsigned char *buf = read_bytes(seeds[i], &n);
    CHECK(buf != NULL);
    if (!buf) continue;
    int rc;
    if (i < 2) {
      dynemb_ckpt_src src;
      dynemb_ckpt_src_mem(&src, buf, n);
      rc = dynemb_ckpt_table_read(&src, seeds[i], NULL, NULL);
    } else {
      dynemb_manifest m;
      rc = dynemb_manifest_parse((const char *)buf, n, seeds[i], &m);
      if (!rc) { /* a full checkpoint of 2 tables; a delta of 1 */
        CHECK(i == 2 ? m.n == 2 && !m.parent
                     : m.n == 1 && m.parent && !strcmp(m.parent, "../base"));
        dynemb_manifest_free(&m);
      }
    }
    CHECK_OK(rc);
    free(buf);
  }
}

/* ---- real tables --------------------------------------------------------- */

static dynemb_table *make_table_sharded(const char *name, int dim, int kind,
                                        uint32_t threshold, int shards) {
  dynemb_table_config cfg;
  dynemb_table_config_init(&cfg);
  cfg.name = name;
  cfg.dim = dim;
  cfg.init.kind = DYNEMB_INIT_UNIFORM;
  cfg.init.a = -1.0f;
  cfg.init.b = 1.0f;
  cfg.init.seed = 42;
  cfg.optimizer.kind = kind;
  cfg.optimizer.learning_rate = 0.05f;
  cfg.optimizer.initial_accumulator_value = 0.3f;
  cfg.access_threshold = threshold;
  cfg.shards = shards;
  dynemb_table *t = NULL;
  int rc = dynemb_table_create(&cfg, &t);
  if (rc) fprintf(stderr, "create %s: %s\n", name, dynemb_last_error());
  return t;
}

static dynemb_table *make_table(const char *name, int dim, int kind,
                                uint32_t threshold) {
  return make_table_sharded(name, dim, kind, threshold, 8);
}

/* Trains `t` a little: rows for keys 0..rows-1 (looked up twice, so they
 * pass an admission threshold of 2), candidates for the next `cands` keys
 * (seen once), a few apply steps, varied access times. */
static void train(dynemb_table *t, int64_t rows, int64_t cands) {
  int dim = dynemb_table_dim(t);
  int64_t n = rows + cands;
  int64_t *keys = malloc((size_t)n * sizeof *keys);
  float *out = malloc((size_t)n * (size_t)dim * sizeof *out);
  for (int64_t i = 0; i < n; i++) keys[i] = i * 7919 - 100000;
  CHECK_OK(dynemb_lookup(t, keys, (size_t)n, DYNEMB_LOOKUP_TRAIN, 100, NULL,
                         out, NULL));
  for (int step = 0; step < 3; step++) {
    CHECK_OK(dynemb_lookup(t, keys, (size_t)rows, DYNEMB_LOOKUP_TRAIN,
                           200 + step, NULL, out, NULL));
    for (int64_t i = 0; i < rows * dim; i++)
      out[i] = (float)((double)(rnd() % 2001) / 1000.0 - 1.0);
    CHECK_OK(dynemb_apply(t, keys, (size_t)rows, out, -1.0f, NULL, NULL));
  }
  free(keys);
  free(out);
}

static void table_snap(dynemb_table *t, dynemb_snapshot *s) {
  CHECK_OK(dynemb_table_snapshot(t, s));
}

/* AdamW (kind 4, the newest) keeps m and v like Adam: its rows and slots
 * round trip exactly, the header records kind 4, and an Adam table refuses
 * them (same row layout, other optimizer: the slots would be mistaken for
 * Adam's without the decay) unless only the embeddings are taken. */
static void test_tables_roundtrip_adamw(void) {
  char dir[600];
  fresh_dir(dir, sizeof dir, "adamw");
  dynemb_table *t = make_table("ck_adamw", 3, DYNEMB_OPT_ADAMW, 1);
  CHECK(t != NULL);
  if (!t) return;
  train(t, 40, 0);
  dynemb_snapshot st, lt;
  table_snap(t, &st);
  CHECK(st.optimizer_kind == DYNEMB_OPT_ADAMW && st.row_floats == 9);
  int moments = 0; /* the slots hold trained moments, not fresh zeros */
  for (size_t r = 0; r < st.rows; r++)
    for (int j = 3; j < 9; j++) moments += st.values[r * 9 + (size_t)j] != 0;
  CHECK(moments > 0);
  CHECK_OK(dynemb_checkpoint_save(dir, &t, 1));
  CHECK(read_equals(dir, "ck_adamw", &st));
  dynemb_ckpt_entry *e;
  size_t n;
  CHECK_OK(dynemb_checkpoint_inspect(dir, &e, &n));
  CHECK(n == 1 && e[0].optimizer_kind == DYNEMB_OPT_ADAMW);
  dynemb_ckpt_entries_free(e, n);
  dynemb_table_release(t);
  CHECK_OK(dynemb_table_drop("ck_adamw"));

  t = make_table("ck_adamw", 3, DYNEMB_OPT_ADAMW, 1);
  CHECK_OK(
      dynemb_checkpoint_load(dir, t, NULL, DYNEMB_IMPORT_REPLACE, 0, 1, NULL));
  table_snap(t, &lt);
  CHECK(snap_equal(&lt, &st));
  dynemb_snapshot_free(&lt);

  dynemb_table *a = make_table("ck_adam_not_w", 3, DYNEMB_OPT_ADAM, 1);
  CHECK_RC(dynemb_checkpoint_load(dir, a, "ck_adamw", 0, 0, 1, NULL),
           DYNEMB_EMISMATCH);
  CHECK(contains(dynemb_last_error(), "adamw"));
  CHECK(dynemb_table_size(a) == 0);
  dynemb_snapshot_free(&st);
  dynemb_table_release(a);
  dynemb_table_release(t);
  CHECK_OK(dynemb_table_drop("ck_adam_not_w"));
  CHECK_OK(dynemb_table_drop("ck_adamw"));
}

static void test_tables_roundtrip(void) {
  char dir[600];
  fresh_dir(dir, sizeof dir, "tables");
  dynemb_table *u = make_table("ck_user", 4, DYNEMB_OPT_ADAM, 2);
  dynemb_table *v = make_table("ck/item id", 3, DYNEMB_OPT_ADAGRAD, 2);
  CHECK(u && v);
  if (!u || !v) return;
  train(u, 300, 40);
  train(v, 50, 0);
  dynemb_snapshot su, sv;
  table_snap(u, &su);
  table_snap(v, &sv);
  CHECK(su.rows == 300 && su.candidates == 40 && su.apply_steps == 3);
  dynemb_table *both[] = {u, v};
  CHECK_OK(dynemb_checkpoint_save(dir, both, 2));
  CHECK_OK(dynemb_checkpoint_verify(dir));

  /* The checkpoint equals the live table. */
  CHECK(read_equals(dir, "ck_user", &su));
  CHECK(read_equals(dir, "ck/item id", &sv));

  /* inspect matches the tables' stats. */
  dynemb_ckpt_entry *e;
  size_t n;
  CHECK_OK(dynemb_checkpoint_inspect(dir, &e, &n));
  CHECK(n == 2);
  for (size_t i = 0; i < n; i++) {
    const dynemb_snapshot *s = !strcmp(e[i].name, "ck_user") ? &su : &sv;
    CHECK(e[i].rows == s->rows && e[i].candidates == s->candidates);
    CHECK(e[i].dim == s->dim && e[i].optimizer_kind == s->optimizer_kind);
    CHECK(e[i].apply_steps == s->apply_steps);
  }
  dynemb_ckpt_entries_free(e, n);

  /* Drop, recreate empty, load by own name: identical contents. */
  dynemb_table_release(u);
  dynemb_table_release(v);
  CHECK_OK(dynemb_table_drop("ck_user"));
  CHECK_OK(dynemb_table_drop("ck/item id"));
  u = make_table("ck_user", 4, DYNEMB_OPT_ADAM, 2);
  v = make_table("ck/item id", 3, DYNEMB_OPT_ADAGRAD, 2);
  CHECK_OK(
      dynemb_checkpoint_load(dir, u, NULL, DYNEMB_IMPORT_REPLACE, 0, 1, NULL));
  CHECK_OK(
      dynemb_checkpoint_load(dir, v, NULL, DYNEMB_IMPORT_REPLACE, 0, 1, NULL));
  dynemb_snapshot lu, lv;
  table_snap(u, &lu);
  table_snap(v, &lv);
  CHECK(snap_equal(&lu, &su));
  CHECK(snap_equal(&lv, &sv));
  dynemb_snapshot_free(&lu);
  dynemb_snapshot_free(&lv);

  /* The lock-shard count is not part of the format: a checkpoint of an
   * 8-shard table loads into 1-shard and default-shard (64) tables alike
   * (checkpoints written before the default changed from 256 load too). */
  const int other_shards[] = {1, 0};
  for (int k = 0; k < 2; k++) {
    dynemb_table *x = make_table_sharded("ck_user_resharded", 4,
                                         DYNEMB_OPT_ADAM, 2, other_shards[k]);
    CHECK(x != NULL);
    if (!x) break;
    CHECK_OK(dynemb_checkpoint_load(dir, x, "ck_user", DYNEMB_IMPORT_REPLACE, 0,
                                    1, NULL));
    table_snap(x, &lu);
    CHECK(snap_equal(&lu, &su));
    dynemb_snapshot_free(&lu);
    dynemb_table_release(x);
    CHECK_OK(dynemb_table_drop("ck_user_resharded"));
  }

  /* Warm start under another name. */
  dynemb_table *w = make_table("ck_user_v2", 4, DYNEMB_OPT_ADAM, 1);
  CHECK_RC(dynemb_checkpoint_load(dir, w, NULL, 0, 0, 1, NULL),
           DYNEMB_ENOTFOUND);
  CHECK(contains(dynemb_last_error(), "'ck_user'"));
  CHECK(dynemb_table_size(w) == 0);
  CHECK_OK(dynemb_checkpoint_load(dir, w, "ck_user", 0, 0, 1, NULL));
  table_snap(w, &lu);
  CHECK(snap_equal(&lu, &su));
  dynemb_snapshot_free(&lu);

  /* Shard-filtered loads partition rows and candidates exactly. */
  enum { NS = 3 };
  dynemb_table *sh[NS];
  size_t rows_sum = 0, cands_sum = 0;
  char *seen = calloc(su.rows, 1);
  for (int i = 0; i < NS; i++) {
    char name[32];
    snprintf(name, sizeof name, "ck_shard_%d", i);
    sh[i] = make_table(name, 4, DYNEMB_OPT_ADAM, 2);
    CHECK_OK(dynemb_checkpoint_load(dir, sh[i], "ck_user", 0, (uint32_t)i, NS,
                                    NULL));
    dynemb_snapshot ss;
    table_snap(sh[i], &ss);
    CHECK(ss.rows > 0 && ss.rows < su.rows);
    rows_sum += ss.rows;
    cands_sum += ss.candidates;
    for (size_t r = 0; r < ss.rows; r++) {
      CHECK(dynemb_key_shard(ss.keys[r], NS) == (uint32_t)i);
      /* find in the full snapshot (sorted) and compare the whole row */
      size_t lo = 0, hi = su.rows;
      while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        if (su.keys[mid] < ss.keys[r]) lo = mid + 1; else hi = mid;
      }
      int found = lo < su.rows && su.keys[lo] == ss.keys[r];
      CHECK(found);
      if (!found) continue;
      CHECK(!seen[lo]);
      seen[lo] = 1;
      CHECK(!memcmp(&ss.values[r * (size_t)ss.row_floats],
                    &su.values[lo * (size_t)su.row_floats],
                    (size_t)su.row_floats * sizeof(float)));
      CHECK(ss.last_access[r] == su.last_access[lo]);
    }
    dynemb_snapshot_free(&ss);
  }
  CHECK(rows_sum == su.rows);
  CHECK(cands_sum == su.candidates);
  for (size_t r = 0; r < su.rows; r++) CHECK(seen[r]);
  free(seen);
  CHECK_RC(dynemb_checkpoint_load(dir, sh[0], "ck_user", 0, 3, 3, NULL),
           DYNEMB_EINVAL);

  /* Wrong dim: EDIM naming both dims; the table is unchanged. */
  dynemb_table *d5 = make_table("ck_dim5", 5, DYNEMB_OPT_ADAM, 1);
  CHECK_RC(dynemb_checkpoint_load(dir, d5, "ck_user", 0, 0, 1, NULL),
           DYNEMB_EDIM);
  CHECK(contains(dynemb_last_error(), "dim 4"));
  CHECK(contains(dynemb_last_error(), "dim 5"));
  CHECK(dynemb_table_size(d5) == 0);

  /* Another optimizer: EMISMATCH, unless EMBEDDING_ONLY (embeddings taken,
   * fresh slots: Adagrad's accumulator starts at initial_accumulator). */
  dynemb_table *g = make_table("ck_adagrad", 4, DYNEMB_OPT_ADAGRAD, 1);
  CHECK_RC(dynemb_checkpoint_load(dir, g, "ck_user", 0, 0, 1, NULL),
           DYNEMB_EMISMATCH);
  CHECK(dynemb_table_size(g) == 0);
  CHECK_OK(dynemb_checkpoint_load(dir, g, "ck_user",
                                  DYNEMB_IMPORT_EMBEDDING_ONLY, 0, 1, NULL));
  dynemb_snapshot sg;
  table_snap(g, &sg);
  CHECK(sg.rows == su.rows && sg.row_floats == 8);
  int emb_bad = 0;
  for (size_t r = 0; r < sg.rows && r < su.rows; r++) {
    if (sg.keys[r] != su.keys[r] ||
        memcmp(&sg.values[r * 8], &su.values[r * (size_t)su.row_floats],
               4 * sizeof(float)) != 0)
      emb_bad++;
    for (int j = 4; j < 8; j++)
      if (sg.values[r * 8 + (size_t)j] != 0.3f) emb_bad++;
  }
  CHECK(emb_bad == 0);
  dynemb_snapshot_free(&sg);

  /* A damaged file fails the load and leaves the table as it was. */
  char ft[1024];
  CHECK(file_of(dir, "ck_user", ft, sizeof ft));
  size_t fn;
  unsigned char *orig = read_bytes(ft, &fn);
  dynemb_snapshot before, after;
  table_snap(u, &before);
  int bad = 0;
  for (int trial = 0; trial < 40; trial++) {
    size_t pos = trial < 20 ? (size_t)trial * 7 : (size_t)(rnd() % fn);
    orig[pos] ^= 0x04;
    write_bytes(ft, orig, fn);
    orig[pos] ^= 0x04;
    int rc =
        dynemb_checkpoint_load(dir, u, NULL, DYNEMB_IMPORT_REPLACE, 0, 1, NULL);
    if (rc != DYNEMB_ECORRUPT) bad++;
  }
  write_bytes(ft, orig, fn);
  free(orig);
  table_snap(u, &after);
  CHECK(bad == 0);
  CHECK(snap_equal(&before, &after));
  dynemb_snapshot_free(&before);
  dynemb_snapshot_free(&after);

  dynemb_table_release(u);
  dynemb_table_release(v);
  dynemb_table_release(w);
  dynemb_table_release(d5);
  dynemb_table_release(g);
  for (int i = 0; i < NS; i++) dynemb_table_release(sh[i]);
  dynemb_snapshot_free(&su);
  dynemb_snapshot_free(&sv);
  dynemb_registry_clear();
}

int main(void) {
  const char *tmp = getenv("TMPDIR");
  snprintf(base_dir, sizeof base_dir, "%s/dynemb-ckpt-XXXXXX",
           tmp && *tmp ? tmp : "/tmp");
  if (!mkdtemp(base_dir)) {
    perror("mkdtemp");
    return 1;
  }
  RUN(test_format_roundtrip);
  RUN(test_format_bytes);
  RUN(test_format_large_streaming);
  RUN(test_manifest_keeps_and_cleans);
  RUN(test_errors);
  RUN(test_corrupt_every_byte);
  RUN(test_corrupt_random);
  RUN(test_truncated_every_length);
  RUN(test_future_version);
  RUN(test_crash_during_save);
  RUN(test_concurrent_saves);
  RUN(test_fuzz_seeds_valid);
  RUN(test_tables_roundtrip);
  RUN(test_tables_roundtrip_adamw);
  rm_tree(base_dir);
  return check_summary();
}
