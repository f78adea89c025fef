/*
 * ckpt_chain.c -- the chain of incremental checkpoints: following it,
 * reading it, merging it, and the file of the keys each delta removed.
 *
 * A delta is an ordinary checkpoint directory of the changed rows whose
 * MANIFEST (format version 2) names the directory it builds on, with that
 * MANIFEST's CRC32, and a file of the keys removed since (its format is
 * below). A reader walks from the directory it was given down to the full
 * checkpoint: every step checks that the directory below is still the one
 * the delta was written against, since a base that was saved again would
 * silently mix two histories. Reading a table merges the chain in memory
 * from the bottom up; loading into a table larger than memory applies the
 * deltas one by one instead (ckpt.c), with the same steps from here.
 */
#include "ckpt_chain.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include "ckpt_io.h"
#include "error.h"

/* ---- the removed-keys file ---------------------------------------------------
 *
 *   "DYNEMBRM"  u32 version (1)  u32 tables
 *   per table: u32 name bytes, name, u64 rows, u64 candidates,
 *              int64 keys[rows], int64 keys[candidates]
 *   u32 CRC32 of everything before it
 * (little-endian) */

#define REMOVED_MAGIC "DYNEMBRM"
#define REMOVED_VERSION 1u

typedef struct wbuf {
  int fd;
  const char *what;
  unsigned char buf[1 << 16];
  size_t len;
  uint64_t total;
  uint32_t crc;
  int rc;
} wbuf;

static void w_flush(wbuf *w) {
  if (w->rc || !w->len) return;
  w->crc = (uint32_t)crc32(w->crc, w->buf, (uInt)w->len);
  int e = dynemb_ckpt_write_all(w->fd, w->buf, w->len);
  if (e)
    w->rc = dynemb_error_set(DYNEMB_EIO, "%s: write failed: %s", w->what,
                             strerror(e));
  w->total += w->len;
  w->len = 0;
}

static void w_bytes(wbuf *w, const void *p, size_t n) {
  const unsigned char *b = p;
  while (n && !w->rc) {
    size_t k = sizeof w->buf - w->len < n ? sizeof w->buf - w->len : n;
    memcpy(w->buf + w->len, b, k);
    w->len += k;
    b += k;
    n -= k;
    if (w->len == sizeof w->buf) w_flush(w);
  }
}

static void w_u32(wbuf *w, uint32_t v) {
  unsigned char b[4];
  dynemb_le_put32(b, v);
  w_bytes(w, b, 4);
}

static void w_u64(wbuf *w, uint64_t v) {
  unsigned char b[8];
  dynemb_le_put64(b, v);
  w_bytes(w, b, 8);
}

int dynemb_ckpt_removed_write(int fd, const char *what,
                              const dynemb_ckpt_delta *d, uint64_t *bytes,
                              uint32_t *crc) {
  wbuf *w = calloc(1, sizeof *w);
  if (!w) return dynemb_error_set(DYNEMB_ENOMEM, "%s: out of memory", what);
  w->fd = fd;
  w->what = what;
  w->crc = (uint32_t)crc32(0L, Z_NULL, 0);
  w_bytes(w, REMOVED_MAGIC, 8);
  w_u32(w, REMOVED_VERSION);
  w_u32(w, (uint32_t)d->n);
  for (size_t i = 0; i < d->n; i++) {
    const dynemb_ckpt_removed *r = &d->tables[i];
    w_u32(w, (uint32_t)strlen(r->name));
    w_bytes(w, r->name, strlen(r->name));
    w_u64(w, r->nrows);
    w_u64(w, r->ncands);
    for (size_t k = 0; k < r->nrows; k++) w_u64(w, (uint64_t)r->rows[k]);
    for (size_t k = 0; k < r->ncands; k++) w_u64(w, (uint64_t)r->cands[k]);
  }
  w_flush(w);
  w_u32(w, w->crc); /* the CRC of everything before it */
  w_flush(w);
  int rc = w->rc;
  if (!rc) {
    *bytes = w->total;
    *crc = w->crc; /* of the whole file, its own CRC included */
  }
  free(w);
  return rc;
}

int dynemb_ckpt_removed_read(int dfd, const dynemb_manifest_entry *e,
                             const char *what, const char *name,
                             int64_t **rows, size_t *nrows, int64_t **cands,
                             size_t *ncands) {
  *rows = *cands = NULL;
  *nrows = *ncands = 0;
  char fwhat[1200];
  snprintf(fwhat, sizeof fwhat, "%s: file '%s'", what, e->file);
  int fd = openat(dfd, e->file, O_RDONLY | O_CLOEXEC);
  if (fd < 0)
    return dynemb_error_set(errno == ENOENT ? DYNEMB_ECORRUPT : DYNEMB_EIO,
                            "%s: cannot open: %s; restore the checkpoint "
                            "directory from a backup",
                            fwhat, strerror(errno));
  struct stat st;
  unsigned char *b = NULL;
  int rc = DYNEMB_OK;
  if (fstat(fd, &st) != 0 || (uint64_t)st.st_size != e->bytes || st.st_size < 20)
    rc = dynemb_error_set(DYNEMB_ECORRUPT, "%s: its size is not the %" PRIu64
                          " bytes the MANIFEST says; restore the checkpoint "
                          "directory from a backup",
                          fwhat, e->bytes);
  else if (!(b = malloc((size_t)st.st_size)))
    rc = dynemb_error_set(DYNEMB_ENOMEM, "%s: out of memory", fwhat);
  else if (dynemb_ckpt_read_all(fd, b, (size_t)st.st_size) != 0)
    rc = dynemb_error_set(DYNEMB_EIO, "%s: read failed", fwhat);
  close(fd);
  const size_t size = rc ? 0 : (size_t)st.st_size;
  if (!rc && ((uint32_t)crc32(0L, b, (uInt)size) != e->crc ||
              (uint32_t)crc32(0L, b, (uInt)(size - 4)) !=
                  dynemb_le_get32(b + size - 4) ||
              memcmp(b, REMOVED_MAGIC, 8) ||
              dynemb_le_get32(b + 8) != REMOVED_VERSION))
    rc = dynemb_error_set(DYNEMB_ECORRUPT, "%s: checksum or header mismatch; "
                          "restore the checkpoint directory from a backup",
                          fwhat);
  size_t p = 16, end = size - 4;
  uint32_t tables = rc ? 0 : dynemb_le_get32(b + 12);
  int found = 0;
  for (uint32_t i = 0; i < tables && !rc && !found; i++) {
    if (end - p < 4) goto bad;
    size_t len = dynemb_le_get32(b + p);
    p += 4;
    if (end - p < len + 16) goto bad;
    int match = len == strlen(name) && !memcmp(b + p, name, len);
    p += len;
    uint64_t nr = dynemb_le_get64(b + p), nc = dynemb_le_get64(b + p + 8);
    p += 16;
    if (nr > (end - p) / 8 || nc > (end - p) / 8 - nr) goto bad;
    if (match) {
      found = 1;
      *rows = malloc(nr * 8 + 1);
      *cands = malloc(nc * 8 + 1);
      if (!*rows || !*cands) {
        rc = dynemb_error_set(DYNEMB_ENOMEM, "%s: out of memory", fwhat);
        break;
      }
      for (size_t k = 0; k < nr; k++) (*rows)[k] = (int64_t)dynemb_le_get64(b + p + 8 * k);
      for (size_t k = 0; k < nc; k++)
        (*cands)[k] = (int64_t)dynemb_le_get64(b + p + 8 * (nr + k));
      *nrows = nr;
      *ncands = nc;
    }
    p += 8 * (nr + nc);
  }
  if (!rc && !found)
    rc = dynemb_error_set(DYNEMB_ECORRUPT, "%s: no removed keys of table '%s' "
                          "(the MANIFEST lists the table); restore the "
                          "checkpoint directory from a backup",
                          fwhat, name);
  goto out;
bad:
  rc = dynemb_error_set(DYNEMB_ECORRUPT, "%s: malformed; restore the "
                        "checkpoint directory from a backup", fwhat);
out:
  if (rc) {
    free(*rows);
    free(*cands);
    *rows = *cands = NULL;
    *nrows = *ncands = 0;
  }
  free(b);
  return rc;
}

/* ---- a chain in memory -------------------------------------------------------- */

static int in_sorted(const int64_t *keys, size_t n, int64_t k) {
  size_t lo = 0, hi = n;
  while (lo < hi) {
    size_t mid = lo + (hi - lo) / 2;
    if (keys[mid] < k) lo = mid + 1;
    else hi = mid;
  }
  return lo < n && keys[lo] == k;
}

int dynemb_ckpt_apply_delta(const dynemb_snapshot *base, const int64_t *rk,
                            size_t nr, const int64_t *ck, size_t nc,
                            const dynemb_snapshot *delta, const char *what,
                            dynemb_snapshot *out) {
  memset(out, 0, sizeof *out);
  if (delta->dim != base->dim || delta->row_floats != base->row_floats ||
      delta->optimizer_kind != base->optimizer_kind)
    return dynemb_error_set(DYNEMB_EMISMATCH,
                            "%s: its rows have dim %d and %d floats (optimizer "
                            "%d) but the checkpoint it builds on has dim %d "
                            "and %d floats (optimizer %d); it belongs to "
                            "another table layout",
                            what, delta->dim, delta->row_floats,
                            delta->optimizer_kind, base->dim,
                            base->row_floats, base->optimizer_kind);
  const size_t rf = (size_t)base->row_floats;
  size_t cap_r = base->rows + delta->rows, cap_c = base->candidates + delta->candidates;
  *out = (dynemb_snapshot){.dim = base->dim, .row_floats = base->row_floats,
                           .optimizer_kind = base->optimizer_kind,
                           .apply_steps = delta->apply_steps};
  out->keys = malloc(cap_r * 8 + 1);
  out->values = malloc(cap_r * rf * sizeof(float) + 1);
  out->last_access = malloc(cap_r * 4 + 1);
  out->cand_keys = malloc(cap_c * 8 + 1);
  out->cand_counts = malloc(cap_c * 4 + 1);
  out->cand_last_access = malloc(cap_c * 4 + 1);
  if (!out->keys || !out->values || !out->last_access || !out->cand_keys ||
      !out->cand_counts || !out->cand_last_access) {
    dynemb_snapshot_free(out);
    return dynemb_error_set(DYNEMB_ENOMEM, "%s: out of memory", what);
  }
  /* rows: merge by key, the delta's winning; removed rows dropped */
  size_t i = 0, j = 0, m = 0;
  while (i < base->rows || j < delta->rows) {
    int from_delta = j < delta->rows &&
                     (i >= base->rows || delta->keys[j] <= base->keys[i]);
    if (from_delta && i < base->rows && delta->keys[j] == base->keys[i]) i++;
    const dynemb_snapshot *s = from_delta ? delta : base;
    size_t k = from_delta ? j++ : i++;
    if (!from_delta && in_sorted(rk, nr, s->keys[k])) continue;
    out->keys[m] = s->keys[k];
    out->last_access[m] = s->last_access[k];
    memcpy(out->values + m * rf, s->values + k * rf, rf * sizeof(float));
    m++;
  }
  out->rows = m;
  /* candidates: the same, and none that is a row now */
  i = j = m = 0;
  while (i < base->candidates || j < delta->candidates) {
    int from_delta = j < delta->candidates &&
                     (i >= base->candidates ||
                      delta->cand_keys[j] <= base->cand_keys[i]);
    if (from_delta && i < base->candidates &&
        delta->cand_keys[j] == base->cand_keys[i])
      i++;
    const dynemb_snapshot *s = from_delta ? delta : base;
    size_t k = from_delta ? j++ : i++;
    int64_t key = s->cand_keys[k];
    if (!from_delta && in_sorted(ck, nc, key)) continue;
    if (in_sorted(out->keys, out->rows, key)) continue;
    out->cand_keys[m] = key;
    out->cand_counts[m] = s->cand_counts[k];
    out->cand_last_access[m] = s->cand_last_access[k];
    m++;
  }
  out->candidates = m;
  return DYNEMB_OK;
}

/* ---- walking the chain ----------------------------------------------------------- */

/* `p` (a MANIFEST's parent) as a path from the directory `dir` that names
 * it, canonical where the directory exists: a long chain's "a/../b/../c/.."
 * would outgrow PATH_MAX. NULL: out of memory. */
static char *parent_path(const char *dir, const char *p) {
  size_t n = strlen(dir) + strlen(p) + 2;
  char *path = malloc(n);
  if (!path) return NULL;
  if (p[0] == '/') snprintf(path, n, "%s", p);
  else snprintf(path, n, "%s/%s", dir, p);
  char *canon = realpath(path, NULL);
  if (canon) {
    free(path);
    path = canon;
  }
  return path;
}

int dynemb_ckpt_chain_parent(const char *dir, const dynemb_ckpt_dir *d,
                             int depth, char **out) {
  *out = NULL;
  if (depth >= DYNEMB_CKPT_CHAIN_MAX)
    return dynemb_error_set(DYNEMB_ECORRUPT, "%s: more than %d incremental "
                            "checkpoints in a chain (a loop of directories?)",
                            d->what, DYNEMB_CKPT_CHAIN_MAX);
  char *path = parent_path(dir, d->m.parent);
  if (!path) return dynemb_error_set(DYNEMB_ENOMEM, "%s: out of memory", d->what);
  uint32_t crc;
  int rc = dynemb_ckpt_manifest_crc(path, &crc);
  if (rc) {
    char msg[DYNEMB_CKPT_WHAT_MAX];
    dynemb_ckpt_what(msg, "%s", dynemb_last_error());
    rc = dynemb_error_set(DYNEMB_ECORRUPT,
                     "%s is incremental: it builds on '%s', which cannot be "
                     "read (%s); restore that directory, or load a full "
                     "checkpoint",
                     d->what, path, msg);
  } else if (crc != d->m.parent_crc) {
    dynemb_error_set(DYNEMB_ECORRUPT,
                     "%s is incremental: it builds on '%s', whose MANIFEST "
                     "is not the one it was written against (stored CRC "
                     "0x%08" PRIx32 ", now 0x%08" PRIx32 "; that directory "
                     "was saved again); restore it, or load a full "
                     "checkpoint",
                     d->what, path, d->m.parent_crc, crc);
    rc = DYNEMB_ECORRUPT;
  }
  if (rc) {
    free(path);
    return rc;
  }
  *out = path;
  return DYNEMB_OK;
}

int dynemb_ckpt_delta_read(dynemb_ckpt_dir *d, const char *name,
                           dynemb_snapshot *snap, int64_t **rk, size_t *nr,
                           int64_t **ck, size_t *nc) {
  int rc = dynemb_ckpt_dir_read(d, name, snap);
  if (rc) return rc;
  rc = dynemb_ckpt_removed_read(d->dfd, &d->m.removed, d->what, name, rk, nr,
                                ck, nc);
  if (rc && snap) dynemb_snapshot_free(snap);
  return rc;
}

static int read_at(const char *dir, const char *name, dynemb_snapshot *snap,
                   int depth) {
  dynemb_ckpt_dir d;
  int rc = dynemb_ckpt_dir_open(dir, &d);
  if (rc) return rc;
  if (!d.m.parent) {
    rc = dynemb_ckpt_dir_read(&d, name, snap);
    dynemb_ckpt_dir_close(&d);
    return rc;
  }
  /* an incremental checkpoint: what it builds on, then its changes */
  char *parent = NULL;
  dynemb_snapshot base = {0}, delta = {0};
  int64_t *rk = NULL, *ck = NULL;
  size_t nr = 0, nc = 0;
  rc = dynemb_ckpt_chain_parent(dir, &d, depth, &parent);
  if (!rc) rc = read_at(parent, name, &base, depth + 1);
  if (!rc) rc = dynemb_ckpt_delta_read(&d, name, &delta, &rk, &nr, &ck, &nc);
  if (!rc) {
    rc = dynemb_ckpt_apply_delta(&base, rk, nr, ck, nc, &delta, d.what, snap);
    dynemb_snapshot_free(&delta);
  }
  dynemb_snapshot_free(&base);
  free(rk);
  free(ck);
  free(parent);
  dynemb_ckpt_dir_close(&d);
  return rc;
}

int dynemb_ckpt_chain_read(const char *dir, const char *name,
                           dynemb_snapshot *snap) {
  return read_at(dir, name, snap, 0);
}

/* Verifies table `name` (NULL: every table) of the one directory `d`. */
static int verify_tables(dynemb_ckpt_dir *d, const char *name) {
  int rc = DYNEMB_OK;
  for (size_t i = 0; i < (name ? 1 : d->m.n) && !rc; i++) {
    const char *t = name ? name : d->m.entries[i].name;
    if (!d->m.parent) { /* a full checkpoint's file */
      rc = dynemb_ckpt_dir_read(d, t, NULL);
      continue;
    }
    int64_t *rk = NULL, *ck = NULL; /* a delta's rows, and the keys removed */
    size_t nr, nc;
    rc = dynemb_ckpt_delta_read(d, t, NULL, &rk, &nr, &ck, &nc);
    free(rk);
    free(ck);
  }
  return rc;
}

static int verify_at(const char *dir, const char *name, int depth) {
  dynemb_ckpt_dir d;
  int rc = dynemb_ckpt_dir_open(dir, &d);
  if (rc) return rc;
  rc = verify_tables(&d, name);
  if (!rc && d.m.parent) { /* and everything it builds on */
    char *parent = NULL;
    rc = dynemb_ckpt_chain_parent(dir, &d, depth, &parent);
    if (!rc) rc = verify_at(parent, name, depth + 1);
    free(parent);
  }
  dynemb_ckpt_dir_close(&d);
  return rc;
}

int dynemb_ckpt_chain_verify(const char *dir, const char *name) {
  return verify_at(dir, name, 0);
}

int dynemb_checkpoint_base(const char *dir, char **base) {
  dynemb_error_clear();
  if (!base)
    return dynemb_error_set(DYNEMB_EINVAL, "checkpoint base: output pointer "
                                           "is NULL");
  *base = NULL;
  dynemb_ckpt_dir d;
  int rc = dynemb_ckpt_dir_open(dir, &d);
  if (rc) return rc;
  if (d.m.parent) {
    *base = parent_path(dir, d.m.parent);
    if (!*base) rc = dynemb_error_set(DYNEMB_ENOMEM, "%s: out of memory", d.what);
  }
  dynemb_ckpt_dir_close(&d);
  return rc;
}
