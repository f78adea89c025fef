/*
 * ckpt.c -- the checkpoint's save and load flow: atomic save (full and
 * incremental), verified load (whole, streamed, along a chain), read,
 * verify, inspect.
 *
 * A checkpoint is a directory with one file per table and a MANIFEST that
 * names them (ckpt_format.c, ckpt_manifest.c). Save never modifies a file
 * the current MANIFEST points to: each save is a new "generation" whose
 * table files get new names; every file is written to a temporary name,
 * fsync'ed and renamed, the directory is fsync'ed, and only then the
 * MANIFEST is replaced the same way. Files of older generations are deleted
 * after the new MANIFEST is durable. A crash at any point therefore leaves
 * either the old or the new checkpoint complete and loadable.
 *
 * Loading reads a table file completely into a snapshot, checking sizes and
 * every checksum, and only then imports it into the table (through the
 * public dynemb_table_import), so a damaged file never half-loads a table.
 * A flock on the directory (exclusive for save, shared for readers) keeps a
 * concurrent save from deleting files a reader is about to open.
 *
 * This file is the flow only: the steps it takes are the rooms below it
 * (ckpt.h lists them), which never call back into it.
 */
#include "ckpt.h"
#include "table.h"

#include <errno.h>
#include <dirent.h>
#include <fcntl.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <unistd.h>

#include <zlib.h>

#include "error.h"

#define WHAT_MAX DYNEMB_CKPT_WHAT_MAX

/* ---- save ------------------------------------------------------------------- */

/* What an incremental save adds to a save of snapshots. */
typedef struct save_opts {
  /* NULL, or per table NULL or where its rows come from (streamed, e.g.
   * from a table reader; the snapshot then has no values) */
  const dynemb_ckpt_rows *const *rows;
  /* non-NULL: an incremental checkpoint, into a directory that holds no
   * checkpoint yet (EINVAL otherwise) */
  const dynemb_ckpt_delta *delta;
  uint32_t manifest_crc; /* out: CRC32 of the MANIFEST written */
} save_opts;

static int cmp_entry(const void *a, const void *b) {
  return strcmp(((const dynemb_manifest_entry *)a)->name,
                ((const dynemb_manifest_entry *)b)->name);
}

typedef struct table_ctx {
  const char *name;
  const dynemb_snapshot *snap;
  const dynemb_ckpt_rows *rows; /* NULL: the values are in snap */
  uint64_t bytes;
  uint32_t crc;
} table_ctx;

static int write_table_fn(int fd, const char *what, void *ctx) {
  table_ctx *c = ctx;
  return dynemb_ckpt_table_write(fd, what, c->name, c->snap, c->rows,
                                 &c->bytes, &c->crc);
}

static int reader_rows_fn(void *ctx, size_t first, size_t n, float *out) {
  return dynemb_table_reader_rows(ctx, first, n, out);
}

typedef struct text_ctx {
  const char *text;
  size_t len;
} text_ctx;

static int write_text_fn(int fd, const char *what, void *ctx) {
  text_ctx *c = ctx;
  int e = dynemb_ckpt_write_all(fd, c->text, c->len);
  if (e)
    return dynemb_error_set(DYNEMB_EIO, "%s: write failed: %s", what,
                            strerror(e));
  return DYNEMB_OK;
}

/* Deletes files a save may have produced that `m` does not reference
 * (older generations, temporaries of crashed saves). Best effort: the new
 * checkpoint is already durable. */
static void delete_unreferenced(int dfd, const dynemb_manifest *m) {
  int fd = dup(dfd);
  if (fd < 0) return;
  DIR *d = fdopendir(fd);
  if (!d) {
    close(fd);
    return;
  }
  rewinddir(d);
  struct dirent *de;
  while ((de = readdir(d)) != NULL) {
    if (!dynemb_manifest_owns_file(de->d_name)) continue;
    int used = m->removed.file && !strcmp(m->removed.file, de->d_name);
    for (size_t i = 0; i < m->n && !used; i++)
      used = !strcmp(m->entries[i].file, de->d_name);
    if (used) continue;
    dynemb_ckpt_fault_point();
    (void)unlinkat(dfd, de->d_name, 0);
  }
  closedir(d);
}

/* Whether any file of `m` belongs to generation `gen`. */
static int generation_used(const dynemb_manifest *m, uint64_t gen) {
  char prefix[32];
  int n = snprintf(prefix, sizeof prefix, "g%06" PRIu64 "-", gen);
  for (size_t i = 0; i < m->n; i++)
    if (!strncmp(m->entries[i].file, prefix, (size_t)n)) return 1;
  return 0;
}

typedef struct removed_ctx {
  const dynemb_ckpt_delta *delta;
  uint64_t bytes;
  uint32_t crc;
} removed_ctx;

static int write_removed_fn(int fd, const char *what, void *ctx) {
  removed_ctx *c = ctx;
  return dynemb_ckpt_removed_write(fd, what, c->delta, &c->bytes, &c->crc);
}

/* Saves tables[i] (snapshotted here) or, if tables is NULL, snaps[i] (with
 * its rows from o->rows[i] when that is set), under names[i]; with
 * o->delta, as an incremental checkpoint into a directory that holds none
 * yet. o->manifest_crc gets the CRC32 of the MANIFEST written, taken under
 * the directory's lock. */
static int save_impl(const char *dir, const char *const *names,
                     dynemb_table *const *tables,
                     const dynemb_snapshot *const *snaps, size_t n,
                     save_opts *o) {
  const dynemb_ckpt_delta *delta = o ? o->delta : NULL;
  dynemb_error_clear();
  char what[WHAT_MAX];
  if (!dir || !*dir)
    return dynemb_error_set(DYNEMB_EINVAL, "checkpoint save: directory path "
                                           "is NULL or empty");
  dynemb_ckpt_what(what, "checkpoint '%s'", dir);
  if (n && !names)
    return dynemb_error_set(DYNEMB_EINVAL, "%s: tables array is NULL", what);
  for (size_t i = 0; i < n; i++) {
    if (!names[i] || !names[i][0])
      return dynemb_error_set(DYNEMB_EINVAL, "%s: table %zu is NULL or has "
                                             "no name", what, i);
    for (size_t j = 0; j < i; j++)
      if (!strcmp(names[i], names[j]))
        return dynemb_error_set(DYNEMB_EINVAL,
                                "%s: table '%s' is listed twice; save each "
                                "table once",
                                what, names[i]);
  }
  int dfd = -1;
  int rc = dynemb_ckpt_open_dir(dir, 1, LOCK_EX, what, &dfd);
  if (rc) return rc;
  dynemb_manifest old, next = {0};
  int exists;
  rc = dynemb_manifest_read(dfd, what, &old, &exists);
  if (rc) {
    if (rc == DYNEMB_ECORRUPT || rc == DYNEMB_EVERSION) {
      char msg[WHAT_MAX];
      dynemb_ckpt_what(msg, "%s", dynemb_last_error());
      rc = dynemb_error_set(rc, "%s (save refuses to replace a MANIFEST it "
                                "cannot read, since that would lose the "
                                "tables it lists; move the directory away "
                                "or save elsewhere)",
                            msg);
    }
    close(dfd);
    return rc;
  }
  if ((delta && exists) || (!delta && old.parent)) {
    /* (A full save keeps the tables it does not name; those of a delta
     * hold only its changes, and would pass for whole tables.) */
    dynemb_manifest_free(&old);
    close(dfd);
    return dynemb_error_set(DYNEMB_EINVAL,
                            delta ? "%s: an incremental save writes a new "
                                    "directory, but this one already holds a "
                                    "checkpoint; save into a directory of its "
                                    "own"
                                  : "%s holds an incremental checkpoint; a "
                                    "full save goes into another directory "
                                    "(or remove this one first)",
                            what);
  }
  uint64_t gen = old.generation + 1;
  while (gen == 0 || generation_used(&old, gen)) gen++;
  next.generation = gen;
  next.entries = calloc(old.n + n + 1, sizeof *next.entries);
  char **written = calloc(n + 2, sizeof *written); /* [n]: the removed file */
  char *text = NULL;
  if (!next.entries || !written) {
    rc = dynemb_error_set(DYNEMB_ENOMEM, "%s: out of memory", what);
    goto done;
  }
  if (delta) {
    char file[64], tmp[80], fwhat[WHAT_MAX];
    snprintf(file, sizeof file, "g%06" PRIu64 "-removed.drem", gen);
    snprintf(tmp, sizeof tmp, "%s.tmp", file);
    dynemb_ckpt_what(fwhat, "%s: file '%s'", what, tmp);
    removed_ctx rcx = {.delta = delta};
    rc = dynemb_ckpt_write_atomic(dfd, tmp, file, fwhat, write_removed_fn, &rcx);
    if (rc) goto done;
    written[n] = strdup(file);
    next.parent = strdup(delta->parent);
    next.parent_crc = delta->parent_crc;
    next.removed.file = strdup(file);
    next.removed.bytes = rcx.bytes;
    next.removed.crc = rcx.crc;
    if (!written[n] || !next.parent || !next.removed.file) {
      rc = dynemb_error_set(DYNEMB_ENOMEM, "%s: out of memory", what);
      goto done;
    }
  }
  for (size_t i = 0; i < n && !rc; i++) {
    char file[64], tmp[80], fwhat[WHAT_MAX];
    snprintf(file, sizeof file, "g%06" PRIu64 "-t%04zu.dtab", gen, i);
    snprintf(tmp, sizeof tmp, "%s.tmp", file);
    dynemb_ckpt_what(fwhat, "%s: file '%s' of table '%s'", what, tmp,
             names[i]);
    dynemb_snapshot own = {0};
    table_ctx c = {.name = names[i], .snap = tables ? &own : snaps[i],
                   .rows = !tables && o && o->rows ? o->rows[i] : NULL};
    /* A table with an SSD tier may be larger than memory: its rows are
     * streamed from the tiers into the file, under its read locks, rather
     * than copied into a snapshot first. */
    dynemb_table_reader *rd = NULL;
    dynemb_ckpt_rows src;
    if (tables && dynemb_table_has_ssd(tables[i])) {
      rc = dynemb_table_snapshot_open(tables[i], &own, &rd);
      src.fn = reader_rows_fn;
      src.ctx = rd;
      c.rows = &src;
    } else if (tables) {
      rc = dynemb_table_snapshot(tables[i], &own);
    }
    if (rc) break;
    rc = dynemb_ckpt_write_atomic(dfd, tmp, file, fwhat, write_table_fn, &c);
    dynemb_table_snapshot_close(rd);
    if (tables) dynemb_snapshot_free(&own);
    if (rc) break;
    written[i] = strdup(file);
    dynemb_manifest_entry *e = &next.entries[next.n];
    e->name = strdup(names[i]);
    e->file = strdup(file);
    e->bytes = c.bytes;
    e->crc = c.crc;
    next.n++;
    if (!written[i] || !e->name || !e->file)
      rc = dynemb_error_set(DYNEMB_ENOMEM, "%s: out of memory", what);
  }
  if (rc) goto done;
  /* Tables of the old MANIFEST that this save does not name are kept. */
  for (size_t i = 0; i < old.n && !rc; i++) {
    int replaced = 0;
    for (size_t j = 0; j < n && !replaced; j++)
      replaced = !strcmp(old.entries[i].name, names[j]);
    if (replaced) continue;
    dynemb_manifest_entry *e = &next.entries[next.n++];
    *e = old.entries[i];
    e->name = strdup(old.entries[i].name);
    e->file = strdup(old.entries[i].file);
    if (!e->name || !e->file)
      rc = dynemb_error_set(DYNEMB_ENOMEM, "%s: out of memory", what);
  }
  if (rc) goto done;
  qsort(next.entries, next.n, sizeof *next.entries, cmp_entry);
  int e = dynemb_ckpt_fsync_dir(dfd); /* the new files' names are durable ... */
  if (e) {
    rc = dynemb_error_set(DYNEMB_EIO, "%s: fsync of the directory failed: %s",
                          what, strerror(e));
    goto done;
  }
  size_t len;
  rc = dynemb_manifest_format(&next, &text, &len);
  if (rc) goto done;
  char mwhat[WHAT_MAX];
  dynemb_ckpt_what(mwhat, "%s: file 'MANIFEST.tmp'", what);
  text_ctx tc = {text, len};
  /* ... before the MANIFEST that points to them replaces the old one. */
  rc = dynemb_ckpt_write_atomic(dfd, DYNEMB_CKPT_MANIFEST ".tmp", DYNEMB_CKPT_MANIFEST,
                    mwhat, write_text_fn, &tc);
  if (rc) goto done;
  if (o) o->manifest_crc = (uint32_t)crc32(0L, (const unsigned char *)text, (uInt)len);
  e = dynemb_ckpt_fsync_dir(dfd);
  if (e) {
    /* The rename happened but may not be durable: report it, and keep the
     * old files, which a crash could still bring back into use. */
    rc = dynemb_error_set(DYNEMB_EIO, "%s: fsync of the directory failed "
                                      "after replacing MANIFEST: %s",
                          what, strerror(e));
    for (size_t i = 0; i <= n; i++) /* keep the new files */
      if (written[i]) written[i][0] = '\0';
    goto done;
  }
  delete_unreferenced(dfd, &next);
done:
  if (rc && written) {
    for (size_t i = 0; i <= n; i++)
      if (written[i] && written[i][0]) (void)unlinkat(dfd, written[i], 0);
  }
  if (written)
    for (size_t i = 0; i <= n; i++) free(written[i]);
  free(written);
  free(text);
  dynemb_manifest_free(&old);
  dynemb_manifest_free(&next);
  close(dfd);
  return rc;
}

int dynemb_ckpt_save_snapshots(const char *dir, const char *const *names,
                               const dynemb_snapshot *const *snaps, size_t n) {
  if (n && !snaps)
    return dynemb_error_set(DYNEMB_EINVAL, "checkpoint save: snapshots "
                                           "array is NULL");
  return save_impl(dir, names, NULL, snaps, n, NULL);
}

/* Incremental saves run one at a time: each reads the tracks of its
 * tables, saves, and replaces them, and a save running in between would
 * make a delta name one base and hold the changes against another. */
static pthread_mutex_t incremental_lock = PTHREAD_MUTEX_INITIALIZER;

int dynemb_checkpoint_save_incremental(const char *dir,
                                       dynemb_table *const *tables, size_t n,
                                       int full, int *delta_out) {
  pthread_mutex_lock(&incremental_lock);
  dynemb_error_clear();
  if (delta_out) *delta_out = 0;
  dynemb_delta_save s;
  int rc = dynemb_delta_save_begin(&s, dir, tables, n, full);
  save_opts o = {.rows = s.rows, .delta = s.delta};
  if (!rc) rc = save_impl(dir, s.names, NULL, s.snaps, n, &o);
  rc = dynemb_delta_save_end(&s, dir, rc, o.manifest_crc, delta_out);
  pthread_mutex_unlock(&incremental_lock);
  return rc;
}

int dynemb_checkpoint_save(const char *dir, dynemb_table *const *tables,
                           size_t n) {
  if (n && !tables)
    return dynemb_error_set(DYNEMB_EINVAL, "checkpoint save: tables array is "
                                           "NULL");
  const char **names = calloc(n + 1, sizeof *names);
  if (!names)
    return dynemb_error_set(DYNEMB_ENOMEM, "checkpoint save: out of memory");
  for (size_t i = 0; i < n; i++)
    names[i] = tables[i] ? dynemb_table_name(tables[i]) : NULL;
  int rc = save_impl(dir, names, tables, NULL, n, NULL);
  free(names);
  return rc;
}

/* ---- reading ---------------------------------------------------------------- */

int dynemb_checkpoint_read(const char *dir, const char *name,
                           dynemb_snapshot *snap) {
  dynemb_error_clear();
  if (!snap || !name)
    return dynemb_error_set(DYNEMB_EINVAL, "checkpoint read: %s is NULL",
                            snap ? "table name" : "snapshot");
  memset(snap, 0, sizeof *snap);
  return dynemb_ckpt_chain_read(dir, name, snap);
}

/* Reads n little-endian elements of `eb` bytes (8: int64, 4: uint32, or
 * 4 with `is_float`: float bits) at `off` into `out`, through a
 * block-sized buffer. */
static int read_elems(int fd, uint64_t off, size_t n, size_t eb, int is_float,
                      void *out, unsigned char *blk, const char *what) {
  size_t per = DYNEMB_CKPT_BLOCK / eb;
  for (size_t done = 0; done < n;) {
    size_t k = n - done < per ? n - done : per;
    int e = dynemb_ckpt_pread_all(fd, blk, k * eb, off + done * eb);
    if (e)
      return dynemb_error_set(DYNEMB_EIO, "%s: read failed: %s", what,
                              e < 0 ? "unexpected end of file" : strerror(e));
    for (size_t i = 0; i < k; i++) {
      if (eb == 8) {
        ((uint64_t *)out)[done + i] = dynemb_le_get64(blk + 8 * i);
      } else if (is_float) {
        uint32_t u = dynemb_le_get32(blk + 4 * i);
        memcpy((float *)out + done + i, &u, 4);
      } else {
        ((uint32_t *)out)[done + i] = dynemb_le_get32(blk + 4 * i);
      }
    }
    done += k;
  }
  return DYNEMB_OK;
}

/* Rows per import step of a streamed load: about 64 MiB of values. */
#define LOAD_CHUNK_BYTES ((size_t)64 << 20)
size_t dynemb_ckpt_load_chunk_rows = 0;

/* The load options' effect on loaded access times: every row and candidate
 * stamped (stamp >= 0), candidates dropped (rows_only; *cands = 0). */
static void apply_options(const dynemb_load_options *o, uint32_t *last,
                          size_t rows, uint32_t *cand_last, size_t *cands) {
  if (!o) return;
  if (o->rows_only) *cands = 0;
  if (o->stamp < 0) return;
  for (size_t i = 0; i < rows; i++) last[i] = (uint32_t)o->stamp;
  for (size_t i = 0; i < *cands; i++) cand_last[i] = (uint32_t)o->stamp;
}

/* Prefixes the failed load's message with the checkpoint and table. */
static int load_error(int rc, const char *dir, const char *name) {
  char msg[WHAT_MAX];
  dynemb_ckpt_what(msg, "%s", dynemb_last_error());
  return dynemb_error_set(rc, "checkpoint '%s', table '%s': %s", dir, name,
                          msg);
}

static int dim_error(const char *dir, const char *name, int ckpt_dim,
                     const char *tname, int dim) {
  return dynemb_error_set(DYNEMB_EDIM,
                          "checkpoint '%s': table '%s' has dim %d, but table "
                          "'%s' has dim %d; load it into a table created "
                          "with dim %d",
                          dir, name, ckpt_dim, tname, dim, ckpt_dim);
}

/* dynemb_checkpoint_load into a table with an SSD tier, which may be
 * larger than memory: the file is verified first (one block of memory),
 * then keys, last-access times and candidates are read whole (12 and 16
 * bytes per row and candidate) and the values imported in steps of about
 * 64 MiB, each a dynemb_table_import of those rows (the first one also
 * takes the candidates, the flags and the step count). The checks of the
 * first step (dims, optimizer, sizes) fail before anything changes; a
 * later failure (disk, memory) leaves the rows imported so far. */
static int load_streamed(dynemb_ckpt_dir *d, const dynemb_manifest_entry *e,
                         dynemb_table *t, unsigned flags, uint32_t shard_index,
                         uint32_t shard_count, const dynemb_load_options *o) {
  dynemb_ckpt_header h;
  int rc = dynemb_ckpt_dir_read_table(d, e, 0, &h, NULL, NULL); /* verify everything */
  if (rc) return rc;
  char what[WHAT_MAX];
  dynemb_ckpt_what(what, "%s: file '%s' of table '%s'", d->what, e->file, e->name);
  int fd = openat(d->dfd, e->file, O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    rc = dynemb_error_set(DYNEMB_EIO, "%s: cannot open: %s", what,
                          strerror(errno));
    dynemb_ckpt_header_free(&h);
    return rc;
  }
  const size_t rows = (size_t)h.rows;
  size_t cands = o && o->rows_only ? 0 : (size_t)h.candidates;
  const size_t rf = (size_t)h.row_floats;
  /* section data offsets (docs/checkpoint-format.md): each section is a
   * 16-byte head, the data and a 4-byte CRC */
  const uint64_t keys_off = (uint64_t)h.header_bytes + 16;
  const uint64_t vals_off = keys_off + 8 * (uint64_t)rows + 4 + 16;
  const uint64_t last_off = vals_off + 4 * (uint64_t)rows * rf + 4 + 16;
  const uint64_t ck_off = last_off + 4 * (uint64_t)rows + 4 + 16;
  const uint64_t cc_off = ck_off + 8 * (uint64_t)cands + 4 + 16;
  const uint64_t cl_off = cc_off + 4 * (uint64_t)cands + 4 + 16;
  size_t chunk = dynemb_ckpt_load_chunk_rows
                     ? dynemb_ckpt_load_chunk_rows
                     : LOAD_CHUNK_BYTES / (rf * sizeof(float));
  if (chunk == 0) chunk = 1;
  dynemb_snapshot s = {0};
  s.dim = h.dim;
  s.row_floats = h.row_floats;
  s.optimizer_kind = h.optimizer_kind;
  s.apply_steps = h.apply_steps;
  int64_t *keys = malloc(rows * sizeof *keys + 1);
  uint32_t *last = malloc(rows * sizeof *last + 1);
  float *vals = malloc((rows < chunk ? rows : chunk) * rf * sizeof *vals + 1);
  s.cand_keys = malloc(cands * sizeof *s.cand_keys + 1);
  s.cand_counts = malloc(cands * sizeof *s.cand_counts + 1);
  s.cand_last_access = malloc(cands * sizeof *s.cand_last_access + 1);
  unsigned char *blk = malloc(DYNEMB_CKPT_BLOCK);
  if (!keys || !last || !vals || !s.cand_keys || !s.cand_counts ||
      !s.cand_last_access || !blk)
    rc = dynemb_error_set(DYNEMB_ENOMEM, "%s: out of memory for the keys of "
                          "%zu rows", what, rows);
  if (!rc) rc = read_elems(fd, keys_off, rows, 8, 0, keys, blk, what);
  if (!rc) rc = read_elems(fd, last_off, rows, 4, 0, last, blk, what);
  if (!rc) rc = read_elems(fd, ck_off, cands, 8, 0, s.cand_keys, blk, what);
  if (!rc) rc = read_elems(fd, cc_off, cands, 4, 0, s.cand_counts, blk, what);
  if (!rc) rc = read_elems(fd, cl_off, cands, 4, 0, s.cand_last_access, blk, what);
  if (!rc) apply_options(o, last, rows, s.cand_last_access, &cands);
  s.candidates = cands;
  for (size_t first = 0; !rc && (first < rows || first == 0); first += chunk) {
    size_t n = rows - first < chunk ? rows - first : chunk;
    rc = read_elems(fd, vals_off + 4 * (uint64_t)first * rf, n * rf, 4, 1,
                    vals, blk, what);
    if (rc) break;
    s.rows = n;
    s.keys = keys + first;
    s.values = vals;
    s.last_access = last + first;
    rc = dynemb_table_import(t, &s, flags, shard_index, shard_count);
    /* later steps add rows to the first one's contents and steps */
    flags = (flags & ~(unsigned)DYNEMB_IMPORT_REPLACE) | DYNEMB_IMPORT_KEEP_STEPS;
    s.candidates = 0;
    if (n == 0) break;
  }
  s.candidates = cands;
  s.keys = NULL;
  s.values = NULL;
  s.last_access = NULL;
  dynemb_snapshot_free(&s);
  free(keys);
  free(last);
  free(vals);
  free(blk);
  close(fd);
  dynemb_ckpt_header_free(&h);
  return rc;
}

static int load_full(const char *dir, dynemb_table *t, const char *name,
                     unsigned flags, uint32_t shard_index, uint32_t shard_count,
                     const dynemb_load_options *opts);
static int load_read(const char *dir, dynemb_table *t, const char *name,
                     unsigned flags, uint32_t shard_index, uint32_t shard_count,
                     const dynemb_load_options *opts);

/* Loads a verified chain: the full checkpoint first, then each delta in
 * order (its removed keys, then its rows and candidates). */
static int load_chain(const char *dir, dynemb_table *t, const char *name,
                      unsigned flags, uint32_t shard_index,
                      uint32_t shard_count, const dynemb_load_options *opts,
                      int depth) {
  dynemb_ckpt_dir d;
  int rc = dynemb_ckpt_dir_open(dir, &d);
  if (rc) return rc;
  if (!d.m.parent) {
    dynemb_ckpt_dir_close(&d);
    return load_full(dir, t, name, flags, shard_index, shard_count, opts);
  }
  char *parent = NULL;
  rc = dynemb_ckpt_chain_parent(dir, &d, depth, &parent);
  if (!rc)
    rc = load_chain(parent, t, name, flags, shard_index, shard_count, opts,
                    depth + 1);
  free(parent);
  dynemb_snapshot snap = {0};
  int64_t *rk = NULL, *ck = NULL;
  size_t nr = 0, nc = 0;
  if (!rc) rc = dynemb_ckpt_delta_read(&d, name, &snap, &rk, &nr, &ck, &nc);
  if (!rc && snap.dim != dynemb_table_dim(t))
    rc = dim_error(dir, name, snap.dim, dynemb_table_name(t),
                   dynemb_table_dim(t));
  if (!rc) {
    int rows_only = opts && opts->rows_only;
    dynemb_table_remove_keys(t, rk, nr, ck, rows_only ? 0 : nc);
    apply_options(opts, snap.last_access, snap.rows, snap.cand_last_access,
                  &snap.candidates);
    rc = dynemb_table_import(t, &snap, flags & ~(unsigned)DYNEMB_IMPORT_REPLACE,
                             shard_index, shard_count);
    if (rc) rc = load_error(rc, dir, name);
  }
  dynemb_snapshot_free(&snap);
  free(rk);
  free(ck);
  dynemb_ckpt_dir_close(&d);
  return rc;
}

int dynemb_checkpoint_load(const char *dir, dynemb_table *t,
                           const char *name_in_ckpt, unsigned flags,
                           uint32_t shard_index, uint32_t shard_count,
                           const dynemb_load_options *opts) {
  dynemb_error_clear();
  if (!t)
    return dynemb_error_set(DYNEMB_EINVAL, "checkpoint load: table is NULL");
  if (opts && opts->stamp > (int64_t)UINT32_MAX)
    return dynemb_error_set(DYNEMB_EINVAL,
                            "checkpoint load into table '%s': stamp %lld is "
                            "above 2^32 - 1; pass a time in the table's unit "
                            "(or -1 to keep the saved ones)",
                            dynemb_table_name(t), (long long)opts->stamp);
  const char *tname = dynemb_table_name(t);
  const char *name = name_in_ckpt ? name_in_ckpt : tname;
  if (shard_count > 1 && shard_index >= shard_count)
    return dynemb_error_set(DYNEMB_EINVAL,
                            "checkpoint load into table '%s': shard_index %"
                            PRIu32 " must be below shard_count %" PRIu32,
                            tname, shard_index, shard_count);
  dynemb_ckpt_dir d0;
  int rc0 = dynemb_ckpt_dir_open(dir, &d0);
  if (rc0) return rc0;
  int incremental = d0.m.parent != NULL;
  dynemb_ckpt_dir_close(&d0);
  if (!incremental)
    return load_full(dir, t, name, flags, shard_index, shard_count, opts);
  if (!dynemb_table_has_ssd(t) || !(flags & DYNEMB_IMPORT_REPLACE)) {
    /* The chain merged in memory and imported once: all or nothing, and
     * exactly a full checkpoint's load. (A table on the SSD tier loaded
     * with REPLACE streams the full checkpoint and applies the deltas.) */
    return load_read(dir, t, name, flags, shard_index, shard_count, opts);
  }
  rc0 = dynemb_ckpt_chain_verify(dir, name);
  if (!rc0)
    rc0 = load_chain(dir, t, name, flags, shard_index, shard_count, opts, 0);
  return rc0;
}

/* dynemb_checkpoint_load of a full checkpoint. */
static int load_full(const char *dir, dynemb_table *t, const char *name,
                     unsigned flags, uint32_t shard_index, uint32_t shard_count,
                     const dynemb_load_options *opts) {
  const char *tname = dynemb_table_name(t);
  if (dynemb_table_has_ssd(t)) { /* may be larger than memory */
    dynemb_ckpt_dir d;
    int rc = dynemb_ckpt_dir_open(dir, &d);
    if (rc) return rc;
    const dynemb_manifest_entry *e = dynemb_ckpt_dir_find(&d, name);
    dynemb_ckpt_header h;
    if (e) rc = dynemb_ckpt_dir_read_table(&d, e, 1, &h, NULL, NULL);
    else rc = DYNEMB_ENOTFOUND; /* (dynemb_ckpt_dir_find set the message) */
    if (!rc) {
      if (h.dim != dynemb_table_dim(t))
        rc = dim_error(dir, name, h.dim, tname, dynemb_table_dim(t));
      dynemb_ckpt_header_free(&h);
    }
    if (!rc) {
      rc = load_streamed(&d, e, t, flags, shard_index, shard_count, opts);
      if (rc) rc = load_error(rc, dir, name);
    }
    dynemb_ckpt_dir_close(&d);
    return rc;
  }
  return load_read(dir, t, name, flags, shard_index, shard_count, opts);
}

/* Reads table `name` of checkpoint `dir` whole (a chain merged) and imports
 * it in one dynemb_table_import: checked before the table changes. */
static int load_read(const char *dir, dynemb_table *t, const char *name,
                     unsigned flags, uint32_t shard_index, uint32_t shard_count,
                     const dynemb_load_options *opts) {
  dynemb_snapshot snap;
  int rc = dynemb_checkpoint_read(dir, name, &snap);
  if (rc) return rc;
  int dim = dynemb_table_dim(t);
  if (snap.dim != dim) {
    rc = dim_error(dir, name, snap.dim, dynemb_table_name(t), dim);
  } else {
    /* (rows_only zeroes the count only: the arrays are freed by pointer) */
    apply_options(opts, snap.last_access, snap.rows, snap.cand_last_access,
                  &snap.candidates);
    rc = dynemb_table_import(t, &snap, flags, shard_index, shard_count);
    if (rc) rc = load_error(rc, dir, name);
  }
  dynemb_snapshot_free(&snap);
  return rc;
}

int dynemb_checkpoint_verify(const char *dir) {
  dynemb_error_clear();
  return dynemb_ckpt_chain_verify(dir, NULL);
}

void dynemb_ckpt_entries_free(dynemb_ckpt_entry *entries, size_t n) {
  if (!entries) return;
  for (size_t i = 0; i < n; i++) {
    free(entries[i].name);
    free(entries[i].file);
  }
  free(entries);
}

int dynemb_checkpoint_inspect(const char *dir, dynemb_ckpt_entry **entries,
                              size_t *n) {
  dynemb_error_clear();
  if (!entries || !n)
    return dynemb_error_set(DYNEMB_EINVAL, "checkpoint inspect: output "
                                           "pointer is NULL");
  *entries = NULL;
  *n = 0;
  dynemb_ckpt_dir d;
  int rc = dynemb_ckpt_dir_open(dir, &d);
  if (rc) return rc;
  dynemb_ckpt_entry *out = calloc(d.m.n + 1, sizeof *out);
  if (!out) rc = dynemb_error_set(DYNEMB_ENOMEM, "%s: out of memory", d.what);
  size_t got = 0;
  for (size_t i = 0; i < d.m.n && !rc; i++) {
    const dynemb_manifest_entry *e = &d.m.entries[i];
    dynemb_ckpt_header h;
    dynemb_ckpt_entry *o = &out[got];
    rc = dynemb_ckpt_dir_read_table(&d, e, 1, &h, NULL, &o->file_bytes);
    if (rc) break;
    got++;
    o->name = h.name; /* ownership moves */
    h.name = NULL;
    o->file = strdup(e->file);
    o->format_version = (int)h.version;
    o->dim = h.dim;
    o->row_floats = h.row_floats;
    o->optimizer_kind = h.optimizer_kind;
    o->rows = h.rows;
    o->candidates = h.candidates;
    o->apply_steps = h.apply_steps;
    if (!o->file) rc = dynemb_error_set(DYNEMB_ENOMEM, "%s: out of memory",
                                        d.what);
  }
  dynemb_ckpt_dir_close(&d);
  if (rc) {
    dynemb_ckpt_entries_free(out, got);
    return rc;
  }
  *entries = out;
  *n = got;
  return DYNEMB_OK;
}
