/*
 * dynemb.c -- entry point of the `dynemb` command-line tool: dispatches to
 * the subcommand named by the first argument.
 */
#include <stdio.h>
#include <string.h>

#include "cmds.h"
#include "dynemb.h"

static void usage(FILE *f) {
  fprintf(f,
          "usage: dynemb <command> [args]\n"
          "\n"
          "commands:\n"
          "  bench --rows R --dim D --batch B --dist uniform|zipf:S "
          "--threads T [--json]\n"
          "                        engine throughput against the memory "
          "gather limit\n"
          "  ckpt inspect DIR      tables, rows, dims, optimizer, format "
          "version\n"
          "  ckpt verify DIR       check every file and checksum\n"
          "  ckpt export DIR OUT   tables as NumPy files (keys, embeddings)\n"
          "                        (the ckpt commands read every rank's part of "
          "a checkpoint\n"
          "                        several ranks wrote)\n"
          "  version               print the library version\n");
}

int main(int argc, char **argv) {
  if (argc < 2 || !strcmp(argv[1], "-h") || !strcmp(argv[1], "--help") ||
      !strcmp(argv[1], "help")) {
    usage(argc < 2 ? stderr : stdout);
    return argc < 2 ? 2 : 0;
  }
  if (!strcmp(argv[1], "bench")) return dynemb_cmd_bench(argc - 2, argv + 2);
  if (!strcmp(argv[1], "ckpt")) return dynemb_cmd_ckpt(argc - 2, argv + 2);
  if (!strcmp(argv[1], "version")) {
    printf("dynemb %d.%d.%d (checkpoint format %d)\n", DYNEMB_VERSION_MAJOR,
           DYNEMB_VERSION_MINOR, DYNEMB_VERSION_PATCH,
           DYNEMB_CKPT_FORMAT_VERSION);
    return 0;
  }
  fprintf(stderr, "dynemb: unknown command '%s'\n\n", argv[1]);
  usage(stderr);
  return 2;
}
