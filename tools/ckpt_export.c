/*
 * ckpt_export.c -- `dynemb ckpt export DIR OUT [TABLE ...]`: a checkpoint's
 * tables for other systems, without TensorFlow or Python.
 *
 * Each table (all of DIR's by default) is read and verified whole, then
 * written as two NumPy files, OUT/<table>/keys.npy (int64 [rows], sorted)
 * and OUT/<table>/embeddings.npy (float32 [rows, dim]; no optimizer state),
 * the same files dynemb.export_tables writes. A table goes to a temporary
 * directory first and is renamed into place, so OUT never holds half a
 * table. NumPy's format is a short text header and the raw little-endian
 * array, so it is written here rather than through a library.
 */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cmds.h"
#include "dynemb.h"

/* Writes one .npy file: `descr` ('<i8' or '<f4'), a shape of one or two
 * dimensions, and `bytes` of data. 0 on success, else errno. */
static int write_npy(const char *path, const char *descr, uint64_t rows,
                     int cols, const void *data, size_t bytes) {
  char shape[64], header[256];
  if (cols > 0)
    snprintf(shape, sizeof shape, "(%" PRIu64 ", %d)", rows, cols);
  else
    snprintf(shape, sizeof shape, "(%" PRIu64 ",)", rows);
  int len = snprintf(header, sizeof header,
                     "{'descr': '%s', 'fortran_order': False, 'shape': %s, }",
                     descr, shape);
  /* magic (6) + version (2) + length (2) + header, padded with spaces to a
   * multiple of 64 and ended by a newline */
  while ((10 + len + 1) % 64) header[len++] = ' ';
  header[len++] = '\n';
  FILE *f = fopen(path, "wb");
  if (!f) return errno;
  const unsigned char pre[10] = {0x93, 'N', 'U', 'M', 'P', 'Y', 1, 0,
                                 (unsigned char)(len & 0xff),
                                 (unsigned char)(len >> 8)};
  int ok = fwrite(pre, 1, sizeof pre, f) == sizeof pre &&
           fwrite(header, 1, (size_t)len, f) == (size_t)len &&
           (bytes == 0 || fwrite(data, 1, bytes, f) == bytes);
  int e = ok ? 0 : (errno ? errno : EIO);
  if (fclose(f) != 0 && !e) e = errno;
  return e;
}

static void remove_tree(const char *dir) {
  char p[4096 + 32];
  const char *files[2] = {"keys.npy", "embeddings.npy"};
  for (int i = 0; i < 2; i++) {
    snprintf(p, sizeof p, "%s/%s", dir, files[i]);
    (void)unlink(p);
  }
  (void)rmdir(dir);
}

/* Exports table `name` of checkpoint `dir` into out/<name>. */
static int export_table(const char *dir, const char *out, const char *name) {
  if (!*name || strchr(name, '/') || !strcmp(name, ".") || !strcmp(name, "..")) {
    fprintf(stderr, "dynemb ckpt export: table '%s' cannot be a directory name "
            "(a '/' or '.' / '..'); export it with dynemb.export_tables under "
            "another name\n", name);
    return 1;
  }
  dynemb_snapshot s;
  memset(&s, 0, sizeof s);
  if (dynemb_checkpoint_read(dir, name, &s) != DYNEMB_OK) {
    fprintf(stderr, "dynemb ckpt export: %s\n", dynemb_last_error());
    return 1;
  }
  int rc = 1;
  float *emb = malloc(s.rows * (size_t)s.dim * sizeof *emb + 1);
  char tmp[4096], final[4096], path[4096 + 32];
  if (snprintf(final, sizeof final, "%s/%s", out, name) >= (int)sizeof final ||
      snprintf(tmp, sizeof tmp, "%s/%s.tmp-export", out, name) >= (int)sizeof tmp) {
    fprintf(stderr, "dynemb ckpt export: table '%s': the path under %s is too "
            "long\n", name, out);
    goto done;
  }
  if (!emb) {
    fprintf(stderr, "dynemb ckpt export: table '%s': out of memory for %zu "
            "rows\n", name, s.rows);
    goto done;
  }
  for (size_t r = 0; r < s.rows; r++)
    memcpy(emb + r * (size_t)s.dim, s.values + r * (size_t)s.row_floats,
           (size_t)s.dim * sizeof *emb);
  remove_tree(tmp);
  int e = mkdir(tmp, 0755) ? errno : 0;
  if (!e) {
    snprintf(path, sizeof path, "%s/keys.npy", tmp);
    e = write_npy(path, "<i8", s.rows, 0, s.keys, s.rows * sizeof *s.keys);
  }
  if (!e) {
    snprintf(path, sizeof path, "%s/embeddings.npy", tmp);
    e = write_npy(path, "<f4", s.rows, s.dim, emb,
                  s.rows * (size_t)s.dim * sizeof *emb);
  }
  if (!e) {
    remove_tree(final);
    e = rename(tmp, final) ? errno : 0;
  }
  if (e) {
    fprintf(stderr, "dynemb ckpt export: table '%s': cannot write %s (%s)\n",
            name, final, strerror(e));
    remove_tree(tmp);
    goto done;
  }
  printf("%s: %zu rows x %d -> %s\n", name, s.rows, s.dim, final);
  rc = 0;
done:
  free(emb);
  dynemb_snapshot_free(&s);
  return rc;
}

int dynemb_cmd_ckpt_export(int argc, char **argv) {
  if (argc < 2) {
    fprintf(stderr, "usage: dynemb ckpt export DIR OUT [TABLE ...]\n");
    return 2;
  }
  const char *dir = argv[0], *out = argv[1];
  if (mkdir(out, 0755) != 0 && errno != EEXIST) {
    fprintf(stderr, "dynemb ckpt export: cannot create %s (%s)\n", out,
            strerror(errno));
    return 1;
  }
  if (argc > 2) {
    int rc = 0;
    for (int i = 2; i < argc; i++) rc |= export_table(dir, out, argv[i]);
    return rc;
  }
  dynemb_ckpt_entry *e = NULL;
  size_t n = 0;
  if (dynemb_checkpoint_inspect(dir, &e, &n) != DYNEMB_OK) {
    fprintf(stderr, "dynemb ckpt export: %s\n", dynemb_last_error());
    return 1;
  }
  int rc = 0;
  for (size_t i = 0; i < n; i++) rc |= export_table(dir, out, e[i].name);
  dynemb_ckpt_entries_free(e, n);
  return rc;
}
