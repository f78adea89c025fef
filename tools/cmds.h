/*
 * cmds.h -- subcommands of the `dynemb` command-line tool.
 *
 * Each subcommand lives in its own file (bench.c, ckpt_cmd.c) and gets the
 * arguments after its name; it returns the process exit code.
 */
#ifndef DYNEMB_TOOLS_CMDS_H
#define DYNEMB_TOOLS_CMDS_H

int dynemb_cmd_bench(int argc, char **argv); /* bench.c */
int dynemb_cmd_ckpt(int argc, char **argv);  /* ckpt_cmd.c */
int dynemb_cmd_ckpt_export(int argc, char **argv); /* ckpt_export.c */

#endif
