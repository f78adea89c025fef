/*
 * ckpt_parts.c -- a checkpoint's parts and their tables for the `dynemb
 * ckpt` subcommands (ckpt_parts.h).
 *
 * Which parts make up a checkpoint is the engine's rule
 * (dynemb_checkpoint_parts); this file reads each part's tables and sums
 * them per table, so that the subcommands show and check a checkpoint of
 * N ranks as one checkpoint whose rows are spread over N directories.
 */
#include "ckpt_parts.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

const dynemb_ckpt_entry *ckpt_parts_find(const ckpt_part *part,
                                         const char *name) {
  for (size_t i = 0; i < part->n; i++)
    if (!strcmp(part->entries[i].name, name)) return &part->entries[i];
  return NULL;
}

static int cmp_total(const void *a, const void *b) {
  return strcmp(((const ckpt_total *)a)->name, ((const ckpt_total *)b)->name);
}

/* Sums the parts' entries per table into p->total. */
static int sum_tables(ckpt_parts *p) {
  size_t cap = 0;
  for (size_t i = 0; i < p->n; i++) cap += p->part[i].n;
  p->total = calloc(cap + 1, sizeof *p->total);
  if (!p->total) return -1;
  for (size_t i = 0; i < p->n; i++) {
    const ckpt_part *part = &p->part[i];
    for (size_t j = 0; j < part->n; j++) {
      const dynemb_ckpt_entry *e = &part->entries[j];
      ckpt_total *t = NULL;
      for (size_t k = 0; k < p->ntotal && !t; k++)
        if (!strcmp(p->total[k].name, e->name)) t = &p->total[k];
      if (!t) {
        t = &p->total[p->ntotal++];
        t->name = e->name;
        t->dim = e->dim;
        t->row_floats = e->row_floats;
        t->optimizer_kind = e->optimizer_kind;
        t->format_version = e->format_version;
      } else if (!t->differs &&
                 (e->dim != t->dim || e->row_floats != t->row_floats ||
                  e->optimizer_kind != t->optimizer_kind)) {
        t->differs = part;
      }
      t->rows += e->rows;
      t->candidates += e->candidates;
      t->file_bytes += e->file_bytes;
      if (e->apply_steps > t->apply_steps) t->apply_steps = e->apply_steps;
      t->parts++;
    }
  }
  if (p->ntotal) qsort(p->total, p->ntotal, sizeof *p->total, cmp_total);
  return 0;
}

int ckpt_parts_open(const char *dir, const char *cmd, int headers,
                    ckpt_parts *p) {
  memset(p, 0, sizeof *p);
  p->dir = dir;
  if (dynemb_checkpoint_parts(dir, &p->paths, &p->n) != DYNEMB_OK) {
    fprintf(stderr, "dynemb ckpt %s: %s\n", cmd, dynemb_last_error());
    return 1;
  }
  p->ranked = p->n > 1 || strcmp(p->paths[0], dir) != 0;
  p->part = calloc(p->n, sizeof *p->part);
  if (!p->part) {
    fprintf(stderr, "dynemb ckpt %s: out of memory\n", cmd);
    ckpt_parts_close(p);
    return 1;
  }
  const size_t skip = strlen(dir) + 1; /* "<dir>/" before a part's name */
  for (size_t i = 0; i < p->n; i++) {
    ckpt_part *part = &p->part[i];
    part->path = p->paths[i];
    part->label = p->ranked ? part->path + skip : part->path;
    if (!headers) continue;
    if (dynemb_checkpoint_inspect(part->path, &part->entries, &part->n) !=
        DYNEMB_OK) {
      if (p->ranked)
        fprintf(stderr, "dynemb ckpt %s: part %s of %zu: %s\n", cmd,
                part->label, p->n, dynemb_last_error());
      else
        fprintf(stderr, "dynemb ckpt %s: %s\n", cmd, dynemb_last_error());
      ckpt_parts_close(p);
      return 1;
    }
    if (dynemb_checkpoint_base(part->path, &part->base) != DYNEMB_OK)
      part->base = NULL;
  }
  if (headers && sum_tables(p)) {
    fprintf(stderr, "dynemb ckpt %s: out of memory\n", cmd);
    ckpt_parts_close(p);
    return 1;
  }
  return 0;
}

void ckpt_parts_close(ckpt_parts *p) {
  for (size_t i = 0; p->part && i < p->n; i++) {
    dynemb_ckpt_entries_free(p->part[i].entries, p->part[i].n);
    free(p->part[i].base);
  }
  free(p->part);
  free(p->total);
  free(p->paths);
  memset(p, 0, sizeof *p);
}
