/*
 * serving_export.c -- a table's keys and embeddings as two raw files that
 * a graph of stock TensorFlow ops loads (ReadFile + DecodeRaw), so that a
 * SavedModel serves the table without dynemb (the TF bridge's export).
 *
 * The files carry no header: the SavedModel's graph knows the row count
 * and dim, and TensorFlow's DecodeRaw reads plain little-endian arrays.
 * Rows are streamed through a bounded buffer from memory or the SSD tier,
 * so a table larger than memory exports without being held whole.
 */
#include "table_int.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "ckpt_io.h"
#include "error.h"

/* Rows per block: bounded memory whatever the table size. */
#define EXPORT_BLOCK_ROWS 4096u

typedef struct out_file {
  const char *path;
  char *tmp;
  int fd;
} out_file;

static int io_error(const char *table, const char *path, const char *what,
                    int err) {
  return dynemb_error_set(DYNEMB_EIO, "table '%s': export to '%s': %s: %s",
                          table, path, what, strerror(err));
}

static int out_open(out_file *f, const char *path, const char *table) {
  f->path = path;
  f->fd = -1;
  size_t n = strlen(path) + sizeof ".tmp-export";
  f->tmp = malloc(n);
  if (!f->tmp)
    return dynemb_error_set(DYNEMB_ENOMEM, "table '%s': out of memory",
                            table);
  snprintf(f->tmp, n, "%s.tmp-export", path);
  f->fd = open(f->tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (f->fd < 0) return io_error(table, f->tmp, "open", errno);
  return DYNEMB_OK;
}

static int out_write(out_file *f, const void *buf, size_t n,
                     const char *table) {
  int err = dynemb_ckpt_write_all(f->fd, buf, n);
  return err ? io_error(table, f->tmp, "write", err) : DYNEMB_OK;
}

/* fsync, close and rename into place; on error (rc != OK on entry, too)
 * the temporary file is removed. */
static int out_finish(out_file *f, int rc, const char *table) {
  if (f->fd >= 0) {
    int err = rc == DYNEMB_OK ? dynemb_ckpt_fsync(f->fd) : 0;
    if (err) rc = io_error(table, f->tmp, "fsync", err);
    if (close(f->fd) != 0 && rc == DYNEMB_OK)
      rc = io_error(table, f->tmp, "close", errno);
    if (rc == DYNEMB_OK && rename(f->tmp, f->path) != 0)
      rc = io_error(table, f->path, "rename", errno);
    if (rc != DYNEMB_OK) unlink(f->tmp);
  }
  free(f->tmp);
  f->tmp = NULL;
  f->fd = -1;
  return rc;
}

static void put_floats(unsigned char *out, const float *v, size_t n) {
  for (size_t i = 0; i < n; i++) {
    uint32_t u;
    memcpy(&u, &v[i], sizeof u);
    dynemb_le_put32(out + 4 * i, u);
  }
}

static int write_keys(out_file *f, const dynemb_snapshot *snap,
                      unsigned char *buf, const char *table) {
  for (size_t i = 0; i < snap->rows; i += EXPORT_BLOCK_ROWS) {
    size_t n = snap->rows - i < EXPORT_BLOCK_ROWS ? snap->rows - i
                                                  : EXPORT_BLOCK_ROWS;
    for (size_t j = 0; j < n; j++)
      dynemb_le_put64(buf + 8 * j, (uint64_t)snap->keys[i + j]);
    int rc = out_write(f, buf, 8 * n, table);
    if (rc) return rc;
  }
  return DYNEMB_OK;
}

static int write_rows(out_file *f, const dynemb_table_reader *rd,
                      const dynemb_snapshot *snap, const float *dflt,
                      float *rows, unsigned char *buf, const char *table) {
  const size_t dim = (size_t)snap->dim, rf = (size_t)snap->row_floats;
  for (size_t i = 0; i < snap->rows; i += EXPORT_BLOCK_ROWS) {
    size_t n = snap->rows - i < EXPORT_BLOCK_ROWS ? snap->rows - i
                                                  : EXPORT_BLOCK_ROWS;
    int rc = dynemb_table_reader_rows(rd, i, n, rows);
    if (rc) return rc; /* the message names the table and the disk */
    for (size_t j = 0; j < n; j++) put_floats(buf + 4 * dim * j, rows + rf * j, dim);
    rc = out_write(f, buf, 4 * dim * n, table);
    if (rc) return rc;
  }
  put_floats(buf, dflt, dim);
  return out_write(f, buf, 4 * dim, table);
}

int dynemb_table_export_raw(dynemb_table *t, const char *keys_path,
                            const char *rows_path, uint64_t *rows_out) {
  dynemb_error_clear();
  if (!t) return dynemb_table_null_error("dynemb_table_export_raw");
  if (!keys_path || !rows_path || !rows_out)
    return dynemb_error_set(DYNEMB_EINVAL,
                            "dynemb_table_export_raw('%s'): keys_path, "
                            "rows_path and rows_out must not be NULL",
                            t->name);
  *rows_out = 0;
  dynemb_snapshot snap;
  dynemb_table_reader *rd = NULL;
  int rc = dynemb_table_snapshot_open(t, &snap, &rd);
  if (rc) return rc;
  const size_t dim = (size_t)snap.dim, rf = (size_t)snap.row_floats;
  float *rows = malloc(EXPORT_BLOCK_ROWS * rf * sizeof *rows);
  float *dflt = malloc(dim * sizeof *dflt);
  unsigned char *buf = malloc(EXPORT_BLOCK_ROWS * (dim > 2 ? 4 * dim : 8));
  out_file keys = {.fd = -1}, vals = {.fd = -1};
  if (!rows || !dflt || !buf) {
    rc = dynemb_error_set(DYNEMB_ENOMEM, "table '%s': out of memory for the "
                          "export buffers", t->name);
    goto done;
  }
  /* The default value changes only under every shard's write lock, which
   * the open reader excludes. */
  memcpy(dflt, t->default_value, dim * sizeof *dflt);
  rc = out_open(&keys, keys_path, t->name);
  if (rc == DYNEMB_OK) rc = write_keys(&keys, &snap, buf, t->name);
  rc = out_finish(&keys, rc, t->name);
  if (rc == DYNEMB_OK) rc = out_open(&vals, rows_path, t->name);
  if (rc == DYNEMB_OK)
    rc = write_rows(&vals, rd, &snap, dflt, rows, buf, t->name);
  rc = out_finish(&vals, rc, t->name);
  if (rc == DYNEMB_OK) *rows_out = snap.rows;
  else unlink(keys_path); /* never one file without the other */
done:
  free(rows);
  free(dflt);
  free(buf);
  dynemb_table_snapshot_close(rd);
  dynemb_snapshot_free(&snap);
  return rc;
}
