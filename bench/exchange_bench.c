/*
 * exchange_bench.c -- the exchange's own bounds on this machine, in C
 * (run under mpirun by bench/ranks.py): how long one all-to-all of
 * dynemb_comm_alltoallv takes when it carries nothing (the latency any
 * exchange pays), when each part has PART bytes (argv[1]: a training step's
 * average part, so that the step's exchanges cost at least their count
 * times this), and how many bytes per second one rank sends in exchanges of
 * 4 MiB parts. Rank 0 prints one JSON line.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "dynemb_comm.h"

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* Runs `rounds` exchanges of `part` bytes to every peer; seconds each. */
static double exchanges(dynemb_comm *c, size_t part, int rounds, char *buf) {
  const int n = dynemb_comm_size(c);
  size_t off[256], len[256], roff[256], rlen[256];
  for (int p = 0; p < n; p++) {
    off[p] = (size_t)p * part;
    len[p] = part;
  }
  char err[512];
  double t0 = now_s();
  for (int r = 0; r < rounds; r++) {
    void *recv = NULL;
    if (dynemb_comm_alltoallv(c, 1, buf, off, len, &recv, roff, rlen, err,
                              sizeof err)) {
      fprintf(stderr, "exchange_bench: %s\n", err);
      exit(1);
    }
    free(recv);
  }
  return (now_s() - t0) / rounds;
}

int main(int argc, char **argv) {
  dynemb_comm *c = NULL;
  char err[512];
  if (dynemb_comm_open(&c, 60, err, sizeof err)) {
    fprintf(stderr, "exchange_bench: %s\n", err);
    return 1;
  }
  const int n = dynemb_comm_size(c);
  if (n > 256) {
    fprintf(stderr, "exchange_bench: at most 256 ranks\n");
    return 1;
  }
  const size_t part = 4u << 20;
  const size_t step_part = argc > 1 ? (size_t)strtoull(argv[1], NULL, 10) : 0;
  char *buf = calloc((size_t)n, part > step_part ? part : step_part);
  if (!buf) return 1;
  exchanges(c, 0, 50, buf); /* warm up */
  double empty = exchanges(c, 0, 2000, buf);
  exchanges(c, step_part, 20, buf);
  double at_step = exchanges(c, step_part, 200, buf);
  exchanges(c, part, 3, buf);
  double big = exchanges(c, part, 20, buf);
  if (dynemb_comm_rank(c) == 0)
    printf("{\"ranks\": %d, \"empty_exchange_us\": %.3f, "
           "\"step_part_bytes\": %zu, \"step_part_exchange_us\": %.3f, "
           "\"link_bytes_per_s\": %.0f, \"part_bytes\": %zu}\n",
           n, empty * 1e6, step_part, at_step * 1e6,
           (double)part * (n - 1) / big, part);
  free(buf);
  dynemb_comm_close(c);
  return 0;
}
