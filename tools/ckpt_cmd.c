/*
 * ckpt_cmd.c -- `dynemb ckpt inspect|verify DIR`: look into a checkpoint
 * directory without TensorFlow.
 *
 * inspect lists each table (rows, candidates, dim, optimizer, format
 * version, apply steps, file size), as a table or as JSON (--json) for
 * scripts; verify reads every file completely and checks every checksum,
 * printing "OK ..." or the engine's message naming the damaged file. Both
 * use only the public checkpoint API.
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

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
          "            OUT/<table>/keys.npy and embeddings.npy\n");
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

static int cmd_inspect(const char *dir, int json) {
  dynemb_ckpt_entry *e = NULL;
  size_t n = 0;
  int rc = dynemb_checkpoint_inspect(dir, &e, &n);
  if (rc) {
    fprintf(stderr, "dynemb ckpt inspect: %s\n", dynemb_last_error());
    return 1;
  }
  char *base = NULL;
  if (dynemb_checkpoint_base(dir, &base) != DYNEMB_OK) base = NULL;
  if (json) {
    printf("{\"dir\": ");
    print_json_string(dir);
    printf(", \"builds_on\": ");
    if (base) print_json_string(base);
    else printf("null");
    printf(", \"tables\": [");
    for (size_t i = 0; i < n; i++) {
      printf("%s\n  {\"name\": ", i ? "," : "");
      print_json_string(e[i].name);
      printf(", \"file\": ");
      print_json_string(e[i].file);
      printf(", \"rows\": %" PRIu64 ", \"candidates\": %" PRIu64
             ", \"dim\": %d, \"row_floats\": %d, \"optimizer\": \"%s\", "
             "\"format_version\": %d, \"apply_steps\": %" PRIu64
             ", \"file_bytes\": %" PRIu64 "}",
             e[i].rows, e[i].candidates, e[i].dim, e[i].row_floats,
             dynemb_optimizer_name(e[i].optimizer_kind), e[i].format_version,
             e[i].apply_steps, e[i].file_bytes);
    }
    printf("%s]}\n", n ? "\n" : "");
  } else {
    printf("checkpoint %s: %zu table%s\n", dir, n, n == 1 ? "" : "s");
    if (base)
      printf("incremental: the rows changed since %s (loads follow that "
             "chain)\n", base);
    /* The name goes last: it may be long or hold any character. */
    if (n)
      printf("%12s %12s %6s %-9s %6s %12s %14s  %-20s %s\n", "rows",
             "candidates", "dim", "optimizer", "format", "apply_steps",
             "bytes", "file", "table");
    for (size_t i = 0; i < n; i++) {
      printf("%12" PRIu64 " %12" PRIu64 " %6d %-9s %6d %12" PRIu64
             " %14" PRIu64 "  %-20s ",
             e[i].rows, e[i].candidates, e[i].dim,
             dynemb_optimizer_name(e[i].optimizer_kind), e[i].format_version,
             e[i].apply_steps, e[i].file_bytes, e[i].file);
      print_text_name(e[i].name);
      putchar('\n');
    }
  }
  dynemb_ckpt_entries_free(e, n);
  free(base);
  return 0;
}

static int cmd_verify(const char *dir) {
  if (dynemb_checkpoint_verify(dir) != DYNEMB_OK) {
    fprintf(stderr, "dynemb ckpt verify: %s\n", dynemb_last_error());
    return 1;
  }
  dynemb_ckpt_entry *e = NULL;
  size_t n = 0;
  uint64_t bytes = 0;
  if (dynemb_checkpoint_inspect(dir, &e, &n) == DYNEMB_OK)
    for (size_t i = 0; i < n; i++) bytes += e[i].file_bytes;
  dynemb_ckpt_entries_free(e, n);
  printf("OK: checkpoint %s verified (%zu table%s, %" PRIu64
         " bytes, all checksums match)\n",
         dir, n, n == 1 ? "" : "s", bytes);
  return 0;
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
