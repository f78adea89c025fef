/*
 * ckpt_parts.c -- which engine checkpoints make up a checkpoint written by
 * several ranks.
 *
 * Each of N ranks writes the keys it owns as an engine checkpoint of its
 * own, `<dir>/rank-<r>-of-<N>` (docs/distributed.md). Every reader of such a
 * checkpoint (the Python restore and export, the command-line tool) needs
 * the same answer to "which parts, and are they all there", so the rule
 * lives here once: only the names the writer makes count as parts, every
 * part must come from one rank count, and a missing rank is an error
 * naming it rather than a checkpoint with a hole in its keys.
 */
#include <dirent.h>
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "error.h"

/* Ranks named in a message about missing parts before it says "...". */
#define MISSING_SHOWN 8

typedef struct part {
  uint32_t rank, size;
} part;

/* Reads a decimal number written without leading zeros (as the writer
 * writes them) below 2^32; returns the end, or NULL. */
static const char *read_u32(const char *s, uint32_t *out) {
  if (*s < '0' || *s > '9' || (s[0] == '0' && s[1] >= '0' && s[1] <= '9'))
    return NULL;
  uint64_t v = 0;
  for (; *s >= '0' && *s <= '9'; s++) {
    v = v * 10 + (uint64_t)(*s - '0');
    if (v > UINT32_MAX) return NULL;
  }
  *out = (uint32_t)v;
  return s;
}

/* Whether `name` is a part's name, rank-<r>-of-<N> with r < N. */
static int parse_part(const char *name, part *p) {
  if (strncmp(name, "rank-", 5)) return 0;
  const char *s = read_u32(name + 5, &p->rank);
  if (!s || strncmp(s, "-of-", 4)) return 0;
  s = read_u32(s + 4, &p->size);
  return s && !*s && p->rank < p->size;
}

static int cmp_part(const void *a, const void *b) {
  const part *x = a, *y = b;
  if (x->size != y->size) return x->size < y->size ? -1 : 1;
  return x->rank < y->rank ? -1 : x->rank > y->rank;
}

/* The parts found in `dir` (sorted by rank count, then rank) into *out;
 * an unreadable directory has none. */
static int list_parts(const char *dir, part **out, size_t *n) {
  *out = NULL;
  *n = 0;
  DIR *d = opendir(dir);
  if (!d) return DYNEMB_OK; /* not a directory: the caller reads it as one */
  size_t cap = 0;
  int rc = DYNEMB_OK;
  struct dirent *e;
  while ((e = readdir(d)) != NULL) {
    part p;
    if (!parse_part(e->d_name, &p)) continue;
    if (*n == cap) {
      size_t ncap = cap ? 2 * cap : 8;
      part *grown = realloc(*out, ncap * sizeof *grown);
      if (!grown) {
        rc = dynemb_error_set(DYNEMB_ENOMEM, "checkpoint '%s': out of memory "
                              "listing its parts", dir);
        break;
      }
      *out = grown;
      cap = ncap;
    }
    (*out)[(*n)++] = p;
  }
  closedir(d);
  if (rc) {
    free(*out);
    *out = NULL;
    *n = 0;
    return rc;
  }
  if (*n) qsort(*out, *n, sizeof **out, cmp_part);
  return DYNEMB_OK;
}

/* ECORRUPT naming the ranks whose parts are missing (found: the parts,
 * sorted by rank, all of rank count `size`). */
static int missing_error(const char *dir, const part *found, size_t n,
                         uint32_t size) {
  char list[256];
  size_t len = 0, shown = 0;
  uint64_t missing = (uint64_t)size - n;
  size_t next = 0;
  list[0] = '\0';
  for (uint32_t r = 0; r < size && shown < MISSING_SHOWN; r++) {
    if (next < n && found[next].rank == r) {
      next++;
      continue;
    }
    int w = snprintf(list + len, sizeof list - len, "%s%" PRIu32,
                     shown ? ", " : "", r);
    if (w < 0 || (size_t)w >= sizeof list - len) break;
    len += (size_t)w;
    shown++;
  }
  return dynemb_error_set(
      DYNEMB_ECORRUPT,
      "checkpoint '%s' was written by %" PRIu32 " ranks, but the parts of "
      "rank(s) %s%s (rank-<r>-of-%" PRIu32 ", %" PRIu64 " in all) are "
      "missing; restore them, or start from another checkpoint",
      dir, size, list, missing > shown ? ", ..." : "", size, missing);
}

int dynemb_checkpoint_parts(const char *dir, char ***parts, size_t *n) {
  dynemb_error_clear();
  if (!parts || !n)
    return dynemb_error_set(DYNEMB_EINVAL, "checkpoint parts: output pointer "
                                           "is NULL");
  *parts = NULL;
  *n = 0;
  if (!dir || !*dir)
    return dynemb_error_set(DYNEMB_EINVAL, "checkpoint parts: directory path "
                                           "is NULL or empty");
  part *found;
  size_t nf;
  int rc = list_parts(dir, &found, &nf);
  if (rc) return rc;
  if (nf && found[0].size != found[nf - 1].size) {
    rc = dynemb_error_set(
        DYNEMB_ECORRUPT,
        "checkpoint '%s' holds parts written by %" PRIu32 " and by %" PRIu32
        " ranks (rank-<r>-of-%" PRIu32 " and rank-<r>-of-%" PRIu32 "); a "
        "checkpoint is written by one set of ranks: remove the stray parts",
        dir, found[0].size, found[nf - 1].size, found[0].size,
        found[nf - 1].size);
  } else if (nf && nf != found[0].size) {
    rc = missing_error(dir, found, nf, found[0].size);
  }
  if (rc) {
    free(found);
    return rc;
  }
  /* One block: the pointers, then the paths they point to. */
  const size_t count = nf ? nf : 1, dlen = strlen(dir);
  const size_t each = dlen + sizeof "/rank--of-" + 2 * 10;
  char **out = malloc(count * (sizeof *out + each));
  if (!out) {
    free(found);
    return dynemb_error_set(DYNEMB_ENOMEM, "checkpoint '%s': out of memory "
                            "listing its parts", dir);
  }
  char *text = (char *)(out + count);
  for (size_t i = 0; i < count; i++) {
    out[i] = text + i * each;
    if (nf)
      snprintf(out[i], each, "%s/rank-%" PRIu32 "-of-%" PRIu32, dir,
               found[i].rank, found[i].size);
    else
      memcpy(out[i], dir, dlen + 1);
  }
  free(found);
  *parts = out;
  *n = count;
  return DYNEMB_OK;
}
