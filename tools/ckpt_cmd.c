/*
 * ckpt_cmd.c -- `dynemb ckpt inspect|verify DIR`: look into a checkpoint
 * directory without TensorFlow.
 *
 * inspect lists each table (rows, candidates, dim, optimizer, format
 * version, apply steps, file size), as a table or as JSON (--json) for
 * scripts; verify reads every file completely and checks every checksum,
 * printing "OK ..." or the engine's message naming the damaged file. Both
 * use only the public checkpoint API.
 *
 * A checkpoint written by several ranks is one part per rank
 * (ckpt_parts.h): inspect shows the rank count, each part's tables and
 * each table summed over the parts; verify checks every part, names each
 * damaged one, and checks that the parts hold the same tables, since a
 * restore needs every part.
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ckpt_parts.h"
#include "cmds.h"
#include "dynemb.h"

static void ckpt_usage(FILE *f) {
  fprintf(f,
          "usage: dynemb ckpt inspect [--json] DIR\n"
          "       dynemb ckpt verify DIR\n"
          "       dynemb ckpt export DIR OUT [TABLE ...]\n"
          "\n"
          "  inspect   list the tables of checkpoint DIR (reads headers "
          "only)\n"
          "  verify    read every file of DIR and check all checksums\n"
          "  export    write each table's keys and embeddings as NumPy files,\n"
          "            OUT/<table>/keys.npy and embeddings.npy\n"
          "\n"
          "A checkpoint that N ranks wrote (parts DIR/rank-<r>-of-<N>) is read "
          "whole:\n"
          "every part, and export writes the rows of all of them.\n");
}


/* Table names may hold any byte: show control bytes and backslashes
 * escaped so one table stays on one line. */
static void print_text_name(const char *s) {
  for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
    if (*p < 0x20 || *p == 0x7f || *p == '\\')
      printf("\\x%02x", *p);
    else
      putchar(*p);
  }
}

/* Length of a valid UTF-8 sequence at p, or 0. */
static int utf8_len(const unsigned char *p) {
  int n;
  uint32_t cp;
  if (p[0] < 0x80) return 1;
  if ((p[0] & 0xe0) == 0xc0) n = 2, cp = p[0] & 0x1f;
  else if ((p[0] & 0xf0) == 0xe0) n = 3, cp = p[0] & 0x0f;
  else if ((p[0] & 0xf8) == 0xf0) n = 4, cp = p[0] & 0x07;
  else return 0;
  for (int i = 1; i < n; i++) {
    if ((p[i] & 0xc0) != 0x80) return 0;
    cp = cp << 6 | (p[i] & 0x3f);
  }
  static const uint32_t min_cp[5] = {0, 0, 0x80, 0x800, 0x10000};
  if (cp < min_cp[n] || cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff))
    return 0;
  return n;
}

/* A JSON string. Bytes that are not valid UTF-8 are written as \u00XX
 * (their Latin-1 reading), so the output is always valid JSON. */
static void print_json_string(const char *s) {
  putchar('"');
  for (const unsigned char *p = (const unsigned char *)s; *p;) {
    int n = utf8_len(p);
    if (n == 1 && *p >= 0x20 && *p != '"' && *p != '\\' && *p != 0x7f) {
      putchar(*p++);
    } else if (n > 1) {
      fwrite(p, 1, (size_t)n, stdout);
      p += n;
    } else {
      if (*p == '"') printf("\\\"");
      else if (*p == '\\') printf("\\\\");
      else if (*p == '\n') printf("\\n");
      else if (*p == '\t') printf("\\t");
      else printf("\\u%04x", *p);
      p++;
    }
  }
  putchar('"');
}

/* One table's numbers, as a JSON object (file: NULL for a sum of parts). */
static void json_table(const char *name, const char *file, uint64_t rows,
                       uint64_t candidates, int dim, int row_floats,
                       int optimizer_kind, int format_version,
                       uint64_t apply_steps, uint64_t file_bytes,
                       size_t parts) {
  printf("{\"name\": ");
  print_json_string(name);
  printf(", \"file\": ");
  if (file) print_json_string(file);
  else printf("null");
  printf(", \"rows\": %" PRIu64 ", \"candidates\": %" PRIu64
         ", \"dim\": %d, \"row_floats\": %d, \"optimizer\": \"%s\", "
         "\"format_version\": %d, \"apply_steps\": %" PRIu64
         ", \"file_bytes\": %" PRIu64 ", \"parts\": %zu}",
         rows, candidates, dim, row_floats,
         dynemb_optimizer_name(optimizer_kind), format_version, apply_steps,
         file_bytes, parts);
}

static void json_entry(const dynemb_ckpt_entry *e) {
  json_table(e->name, e->file, e->rows, e->candidates, e->dim, e->row_floats,
             e->optimizer_kind, e->format_version, e->apply_steps,
             e->file_bytes, 1);
}

/* What every part of an incremental checkpoint of several ranks builds on:
 * the one directory whose parts they build on (malloc'ed), or NULL when
 * the parts do not agree or none builds on anything. */
static char *common_base(const ckpt_parts *p) {
  if (!p->ranked) return p->part[0].base ? strdup(p->part[0].base) : NULL;
  char *out = NULL;
  for (size_t i = 0; i < p->n; i++) {
    const char *b = p->part[i].base, *slash = b ? strrchr(b, '/') : NULL;
    if (!slash || strcmp(slash + 1, p->part[i].label)) {
      free(out);
      return NULL;
    }
    size_t len = (size_t)(slash - b);
    if (!out) {
      out = strndup(b, len);
      if (!out) return NULL;
    } else if (strlen(out) != len || strncmp(out, b, len)) {
      free(out);
      return NULL;
    }
  }
  return out;
}

/* A table not in every part, or not the same in every part, would restore
 * with a hole or fail: said on stderr by inspect, an error for verify. */
static int report_uneven(const ckpt_parts *p, const char *cmd) {
  int bad = 0;
  for (size_t t = 0; t < p->ntotal; t++) {
    const ckpt_total *tt = &p->total[t];
    if (tt->parts != p->n) {
      for (size_t i = 0; i < p->n; i++) {
        if (ckpt_parts_find(&p->part[i], tt->name)) continue;
        fprintf(stderr, "dynemb ckpt %s: part %s of checkpoint %s lacks "
                "table '%s', which %zu of its %zu parts hold; restore that "
                "part from a backup, or use another checkpoint\n", cmd,
                p->part[i].label, p->dir, tt->name, tt->parts, p->n);
        break;
      }
      bad = 1;
    }
    if (tt->differs) {
      const dynemb_ckpt_entry *e = ckpt_parts_find(tt->differs, tt->name);
      fprintf(stderr, "dynemb ckpt %s: table '%s' has dim %d with %s state "
              "in part %s but dim %d with %s state in part %s: the parts "
              "come from different runs; restore the checkpoint from a "
              "backup\n", cmd, tt->name, e->dim,
              dynemb_optimizer_name(e->optimizer_kind), tt->differs->label,
              tt->dim, dynemb_optimizer_name(tt->optimizer_kind),
              p->part[0].label);
      bad = 1;
    }
  }
  return bad;
}

static void inspect_json(const ckpt_parts *p, const char *base) {
  printf("{\"dir\": ");
  print_json_string(p->dir);
  printf(", \"ranks\": %zu, \"builds_on\": ", p->n);
  if (base) print_json_string(base);
  else printf("null");
  printf(", \"tables\": [");
  for (size_t i = 0; i < p->ntotal; i++) {
    const ckpt_total *t = &p->total[i];
    printf("%s\n  ", i ? "," : "");
    if (!p->ranked) {
      json_entry(ckpt_parts_find(&p->part[0], t->name));
      continue;
    }
    json_table(t->name, NULL, t->rows, t->candidates, t->dim, t->row_floats,
               t->optimizer_kind, t->format_version, t->apply_steps,
               t->file_bytes, t->parts);
  }
  printf("%s], \"parts\": [", p->ntotal ? "\n" : "");
  for (size_t i = 0; i < p->n; i++) {
    const ckpt_part *part = &p->part[i];
    printf("%s\n  {\"dir\": ", i ? "," : "");
    print_json_string(part->path);
    printf(", \"rank\": %zu, \"builds_on\": ", i);
    if (part->base) print_json_string(part->base);
    else printf("null");
    printf(", \"tables\": [");
    for (size_t j = 0; j < part->n; j++) {
      printf("%s\n    ", j ? "," : "");
      json_entry(&part->entries[j]);
    }
    printf("%s]}", part->n ? "\n  " : "");
  }
  printf("\n]}\n");
}

static void text_row(uint64_t rows, uint64_t candidates, int dim,
                     int optimizer_kind, int format_version,
                     uint64_t apply_steps, uint64_t bytes, int width,
                     const char *file, const char *file2, const char *name) {
  printf("%12" PRIu64 " %12" PRIu64 " %6d %-9s %6d %12" PRIu64
         " %14" PRIu64 "  ",
         rows, candidates, dim, dynemb_optimizer_name(optimizer_kind),
         format_version, apply_steps, bytes);
  int w = printf("%s%s%s", file, file2 ? "/" : "", file2 ? file2 : "");
  printf("%*s ", w < width ? width - w : 0, "");
  print_text_name(name);
  putchar('\n');
}

static void inspect_text(const ckpt_parts *p, const char *base) {
  size_t n = p->ntotal;
  printf("checkpoint %s: %zu table%s", p->dir, n, n == 1 ? "" : "s");
  if (p->ranked)
    printf(", written by %zu rank%s (parts %s .. %s)", p->n,
           p->n == 1 ? "" : "s", p->part[0].label, p->part[p->n - 1].label);
  putchar('\n');
  if (base && !p->ranked)
    printf("incremental: the rows changed since %s (loads follow that "
           "chain)\n", base);
  else if (base)
    printf("incremental: the rows changed since %s (each part builds on "
           "its part there; loads follow that chain)\n", base);
  else
    for (size_t i = 0; i < p->n; i++)
      if (p->part[i].base)
        printf("incremental: part %s holds the rows changed since %s\n",
               p->part[i].label, p->part[i].base);
  /* The name goes last: it may be long or hold any character. */
  const int width = p->ranked ? 34 : 20;
  if (n)
    printf("%12s %12s %6s %-9s %6s %12s %14s  %-*s %s\n", "rows",
           "candidates", "dim", "optimizer", "format", "apply_steps", "bytes",
           width, p->ranked ? "part/file" : "file", "table");
  for (size_t i = 0; i < n; i++) {
    const ckpt_total *t = &p->total[i];
    for (size_t j = 0; j < p->n; j++) {
      const dynemb_ckpt_entry *e = ckpt_parts_find(&p->part[j], t->name);
      if (e)
        text_row(e->rows, e->candidates, e->dim, e->optimizer_kind,
                 e->format_version, e->apply_steps, e->file_bytes, width,
                 p->ranked ? p->part[j].label : e->file,
                 p->ranked ? e->file : NULL, t->name);
    }
    if (p->ranked) {
      char all[64];
      snprintf(all, sizeof all, "total of %zu part%s", t->parts,
               t->parts == 1 ? "" : "s");
      text_row(t->rows, t->candidates, t->dim, t->optimizer_kind,
               t->format_version, t->apply_steps, t->file_bytes, width, all,
               NULL, t->name);
    }
  }
}

static int cmd_inspect(const char *dir, int json) {
  ckpt_parts p;
  if (ckpt_parts_open(dir, "inspect", 1, &p)) return 1;
  char *base = common_base(&p);
  if (json) inspect_json(&p, base);
  else inspect_text(&p, base);
  (void)report_uneven(&p, "inspect");
  free(base);
  ckpt_parts_close(&p);
  return 0;
}

static int cmd_verify(const char *dir) {
  ckpt_parts p;
  if (ckpt_parts_open(dir, "verify", 0, &p)) return 1;
  size_t damaged = 0;
  for (size_t i = 0; i < p.n; i++) {
    if (dynemb_checkpoint_verify(p.part[i].path) == DYNEMB_OK) continue;
    if (p.ranked)
      fprintf(stderr, "dynemb ckpt verify: part %s is damaged: %s\n",
              p.part[i].label, dynemb_last_error());
    else
      fprintf(stderr, "dynemb ckpt verify: %s\n", dynemb_last_error());
    damaged++;
  }
  if (damaged && p.ranked)
    fprintf(stderr, "dynemb ckpt verify: %zu of the %zu parts of checkpoint "
            "%s failed\n", damaged, p.n, dir);
  ckpt_parts_close(&p);
  if (damaged) return 1;
  /* Every file holds; now the parts must hold the same tables. */
  if (ckpt_parts_open(dir, "verify", 1, &p)) return 1;
  int uneven = report_uneven(&p, "verify");
  uint64_t bytes = 0;
  for (size_t i = 0; i < p.ntotal; i++) bytes += p.total[i].file_bytes;
  if (!uneven) {
    printf("OK: checkpoint %s verified (", dir);
    if (p.ranked) printf("%zu parts, ", p.n);
    printf("%zu table%s, %" PRIu64 " bytes, all checksums match)\n",
           p.ntotal, p.ntotal == 1 ? "" : "s", bytes);
  }
  ckpt_parts_close(&p);
  return uneven;
}

int dynemb_cmd_ckpt(int argc, char **argv) {
  if (argc < 1 || !strcmp(argv[0], "-h") || !strcmp(argv[0], "--help")) {
    ckpt_usage(argc < 1 ? stderr : stdout);
    return argc < 1 ? 2 : 0;
  }
  const char *sub = argv[0];
  if (!strcmp(sub, "export")) return dynemb_cmd_ckpt_export(argc - 1, argv + 1);
  const char *dir = NULL;
  int json = 0;
  for (int i = 1; i < argc; i++) {
    if (!strcmp(argv[i], "--json") && !strcmp(sub, "inspect")) {
      json = 1;
    } else if (argv[i][0] == '-' && argv[i][1] != '\0') {
      fprintf(stderr, "dynemb ckpt %s: unknown option '%s'\n\n", sub,
              argv[i]);
      ckpt_usage(stderr);
      return 2;
    } else if (!dir) {
      dir = argv[i];
    } else {
      fprintf(stderr, "dynemb ckpt %s: one directory expected, got '%s' "
                      "and '%s'\n\n", sub, dir, argv[i]);
      ckpt_usage(stderr);
      return 2;
    }
  }
  if (strcmp(sub, "inspect") && strcmp(sub, "verify")) {
    fprintf(stderr, "dynemb ckpt: unknown subcommand '%s'\n\n", sub);
    ckpt_usage(stderr);
    return 2;
  }
  if (!dir) {
    fprintf(stderr, "dynemb ckpt %s: missing checkpoint directory\n\n", sub);
    ckpt_usage(stderr);
    return 2;
  }
  return !strcmp(sub, "inspect") ? cmd_inspect(dir, json) : cmd_verify(dir);
}
