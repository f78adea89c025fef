/*
 * ckpt_export.c -- `dynemb ckpt export DIR OUT [TABLE ...]`: a checkpoint's
 * tables for other systems, without TensorFlow or Python.
 *
 * Each table (all of DIR's by default) is read and verified whole, then
 * written as two NumPy files, OUT/<table>/keys.npy (int64 [rows], sorted)
 * and OUT/<table>/embeddings.npy (float32 [rows, dim]; no optimizer state),
 * the same files dynemb.export_tables writes. From a checkpoint of several
 * ranks a table's rows are those of every part (ckpt_parts.h), merged by
 * key: the files are what one process holding the whole table writes. A table goes to a temporary
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

#include "ckpt_parts.h"
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

/* A table's rows over every part: keys ascending, each key once (a table
 * replicated on every rank has each key in every part: the first part's
 * row is taken), embeddings only. */
typedef struct merged {
  size_t rows;
  int dim;
  int64_t *keys;
  float *emb;
} merged;

/* Reads table `name` from every part (each verified whole) and merges the
 * parts' sorted keys. 0, or 1 after printing the error. */
static int read_merged(const ckpt_parts *p, const char *name, merged *m) {
  memset(m, 0, sizeof *m);
  dynemb_snapshot *s = calloc(p->n, sizeof *s);
  size_t *at = calloc(p->n, sizeof *at);
  int rc = !s || !at;
  if (rc)
    fprintf(stderr, "dynemb ckpt export: table '%s': out of memory\n", name);
  size_t all = 0;
  for (size_t i = 0; i < p->n && !rc; i++) {
    if (dynemb_checkpoint_read(p->part[i].path, name, &s[i]) != DYNEMB_OK) {
      if (p->ranked)
        fprintf(stderr, "dynemb ckpt export: part %s: %s\n",
                p->part[i].label, dynemb_last_error());
      else
        fprintf(stderr, "dynemb ckpt export: %s\n", dynemb_last_error());
      rc = 1;
    } else if (s[i].dim != s[0].dim) {
      fprintf(stderr, "dynemb ckpt export: table '%s' has dim %d in part %s "
              "but dim %d in part %s: the parts come from different runs; "
              "restore the checkpoint from a backup\n", name, s[i].dim,
              p->part[i].label, s[0].dim, p->part[0].label);
      rc = 1;
    } else {
      all += s[i].rows;
    }
  }
  if (!rc) {
    m->dim = s[0].dim;
    m->keys = malloc(all * sizeof *m->keys + 1);
    m->emb = malloc(all * (size_t)m->dim * sizeof *m->emb + 1);
    if (!m->keys || !m->emb) {
      fprintf(stderr, "dynemb ckpt export: table '%s': out of memory for "
              "%zu rows\n", name, all);
      rc = 1;
    }
  }
  /* k-way merge: a few parts, so the smallest head is found by a scan */
  while (!rc) {
    size_t best = p->n;
    for (size_t i = 0; i < p->n; i++)
      if (at[i] < s[i].rows &&
          (best == p->n || s[i].keys[at[i]] < s[best].keys[at[best]]))
        best = i;
    if (best == p->n) break;
    const int64_t key = s[best].keys[at[best]];
    m->keys[m->rows] = key;
    memcpy(m->emb + m->rows * (size_t)m->dim,
           s[best].values + at[best] * (size_t)s[best].row_floats,
           (size_t)m->dim * sizeof *m->emb);
    m->rows++;
    for (size_t i = 0; i < p->n; i++) /* (sorted: a key once per part) */
      if (at[i] < s[i].rows && s[i].keys[at[i]] == key) at[i]++;
  }
  for (size_t i = 0; s && i < p->n; i++) dynemb_snapshot_free(&s[i]);
  free(s);
  free(at);
  if (rc) {
    free(m->keys);
    free(m->emb);
    memset(m, 0, sizeof *m);
  }
  return rc;
}

/* Exports table `name` of the checkpoint into out/<name>. */
static int export_table(const ckpt_parts *p, const char *out,
                        const char *name) {
  if (!*name || strchr(name, '/') || !strcmp(name, ".") || !strcmp(name, "..")) {
    fprintf(stderr, "dynemb ckpt export: table '%s' cannot be a directory name "
            "(a '/' or '.' / '..'); export it with dynemb.export_tables under "
            "another name\n", name);
    return 1;
  }
  merged m;
  if (read_merged(p, name, &m)) return 1;
  int rc = 1;
  char tmp[4096], final[4096], path[4096 + 32];
  if (snprintf(final, sizeof final, "%s/%s", out, name) >= (int)sizeof final ||
      snprintf(tmp, sizeof tmp, "%s/%s.tmp-export", out, name) >= (int)sizeof tmp) {
    fprintf(stderr, "dynemb ckpt export: table '%s': the path under %s is too "
            "long\n", name, out);
    goto done;
  }
  remove_tree(tmp);
  int e = mkdir(tmp, 0755) ? errno : 0;
  if (!e) {
    snprintf(path, sizeof path, "%s/keys.npy", tmp);
    e = write_npy(path, "<i8", m.rows, 0, m.keys, m.rows * sizeof *m.keys);
  }
  if (!e) {
    snprintf(path, sizeof path, "%s/embeddings.npy", tmp);
    e = write_npy(path, "<f4", m.rows, m.dim, m.emb,
                  m.rows * (size_t)m.dim * sizeof *m.emb);
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
  printf("%s: %zu rows x %d -> %s", name, m.rows, m.dim, final);
  if (p->ranked) printf(" (from %zu parts)", p->n);
  putchar('\n');
  rc = 0;
done:
  free(m.keys);
  free(m.emb);
  return rc;
}

int dynemb_cmd_ckpt_export(int argc, char **argv) {
  if (argc < 2) {
    fprintf(stderr, "usage: dynemb ckpt export DIR OUT [TABLE ...]\n");
    return 2;
  }
  const char *dir = argv[0], *out = argv[1];
  ckpt_parts p;
  if (ckpt_parts_open(dir, "export", argc == 2, &p)) return 1;
  if (mkdir(out, 0755) != 0 && errno != EEXIST) {
    fprintf(stderr, "dynemb ckpt export: cannot create %s (%s)\n", out,
            strerror(errno));
    ckpt_parts_close(&p);
    return 1;
  }
  int rc = 0;
  if (argc > 2)
    for (int i = 2; i < argc; i++) rc |= export_table(&p, out, argv[i]);
  else
    for (size_t i = 0; i < p.ntotal; i++)
      rc |= export_table(&p, out, p.total[i].name);
  ckpt_parts_close(&p);
  return rc;
}
