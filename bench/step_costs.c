/* The table work of one training step of bench/tf_train.py, in C alone:
 * the CPU cost per id of each engine phase (prepare with tickets, prepared
 * lookup, prepared apply) on the benchmark's own batches, without TensorFlow.
 *
 *   build/step_costs IDS_FILE [ROUNDS]     (make bench-step writes IDS_FILE)
 *
 * IDS_FILE (bench/tf_op_costs.py --dump-ids): int32 batches, int32 tables,
 * then per table int32 ids-per-batch and int32 dim, then per table its
 * [batches][ids] int64 ids. Tables are Adagrad (lr 0.05, accumulator 0.1),
 * truncated-normal rows, admission after 2 sightings, as in the benchmark.
 * Every id is prepared twice first (admitted), then each round runs every
 * batch through the three phases in order; the figure is the median over
 * rounds of CPU ns per id (all tables' ids). Between phases (untimed) the
 * harness writes POLLUTE_MB MiB (default 4) of other memory, as the
 * model's layers do between a step's lookups and its applies, so that
 * the phases do not find each other's lines in cache more than they would
 * in training (0 turns it off). One JSON line on stdout. It also times,
 * apart from the three, the route of every batch's ids to 2 owners
 * (`route_2_owners`: deduplication and grouping by owner, what a lookup and
 * an apply on several ranks do before their exchanges: comm/route.c).
 * Exists to iterate on the engine's step path quickly; the TF-level
 * figures are bench/tf_op_costs.py's. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "dynemb.h"
#include "route.h"

static double cpu_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return ts.tv_sec * 1e9 + ts.tv_nsec;
}

static int cmp_d(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

/* Writes `bytes` of `buf` (untimed: evicts the phases' lines). */
static void pollute(unsigned char *buf, size_t bytes) {
  for (size_t i = 0; i < bytes; i += 64) buf[i]++;
}

static void die(const char *what) {
  fprintf(stderr, "step_costs: %s: %s\n", what, dynemb_last_error());
  exit(1);
}

/* The tables and, per table, ids per batch, dim, every batch's ids and
 * tickets, and one batch's output and gradient rows. */
static int32_t nt, *n, *dim;
static int64_t **ids;
static dynemb_ticket **tickets;
static float **out, **grad;
static dynemb_table **t;

enum { PREPARE, LOOKUP, APPLY, ROUTE };

/* One phase of batch b on every table. */
static void phase(int k, int b) {
  for (int i = 0; i < nt; i++) {
    const int64_t *keys = ids[i] + (size_t)b * n[i];
    uint64_t *h = tickets[i] + (size_t)b * n[i];
    if (k == PREPARE &&
        dynemb_prepare(t[i], keys, n[i], DYNEMB_LOOKUP_TRAIN, 0, NULL, h))
      die("prepare");
    if (k == LOOKUP &&
        dynemb_lookup_prepared(t[i], keys, h, n[i], out[i], NULL))
      die("lookup");
    if (k == APPLY && dynemb_apply(t[i], keys, n[i], grad[i], -1.0f,
                                   &(dynemb_apply_opts){.tickets = h}, NULL))
      die("apply");
    if (k == ROUTE) {
      dynemb_shard_route rt;
      if (dynemb_shard_route_build(&rt, keys, (size_t)n[i], 2)) die("route");
      dynemb_shard_route_free(&rt);
    }
  }
}

int main(int argc, char **argv) {
  if (argc < 2) {
    fprintf(stderr, "usage: step_costs IDS_FILE [ROUNDS]\n");
    return 2;
  }
  int rounds = argc > 2 ? atoi(argv[2]) : 7;
  const char *pm = getenv("POLLUTE_MB");
  const size_t pollute_bytes = (size_t)(pm ? atoi(pm) : 4) << 20;
  unsigned char *junk = calloc(pollute_bytes + 64, 1);
  FILE *f = fopen(argv[1], "rb");
  if (!f) {
    perror(argv[1]);
    return 1;
  }
  int32_t nb;
  if (fread(&nb, 4, 1, f) != 1 || fread(&nt, 4, 1, f) != 1 || nb <= 0 ||
      nt <= 0 || nt > 1024) {
    fprintf(stderr, "step_costs: %s: bad header\n", argv[1]);
    return 1;
  }
  n = calloc(nt, 4);
  dim = calloc(nt, 4);
  ids = calloc(nt, sizeof *ids);
  tickets = calloc(nt, sizeof *tickets);
  out = calloc(nt, sizeof *out);
  grad = calloc(nt, sizeof *grad);
  t = calloc(nt, sizeof *t);
  size_t per_batch = 0;
  for (int i = 0; i < nt; i++)
    if (fread(&n[i], 4, 1, f) != 1 || fread(&dim[i], 4, 1, f) != 1) {
      fprintf(stderr, "step_costs: %s: truncated\n", argv[1]);
      return 1;
    }
  unsigned rs = 12345;
  for (int i = 0; i < nt; i++) {
    size_t m = (size_t)nb * n[i];
    ids[i] = malloc(m * 8);
    tickets[i] = malloc(m * 8);
    out[i] = malloc((size_t)n[i] * dim[i] * 4);
    grad[i] = malloc((size_t)n[i] * dim[i] * 4);
    if (fread(ids[i], 8, m, f) != m) {
      fprintf(stderr, "step_costs: %s: truncated\n", argv[1]);
      return 1;
    }
    for (size_t j = 0; j < (size_t)n[i] * dim[i]; j++)
      grad[i][j] = ((rs = rs * 1103515245u + 12345u) >> 8) * (1.0f / 16777216) * 0.02f - 0.01f;
    per_batch += n[i];
    dynemb_table_config c;
    dynemb_table_config_init(&c);
    char name[32];
    snprintf(name, sizeof name, "t%d", i);
    c.name = name;
    c.dim = dim[i];
    c.init.kind = DYNEMB_INIT_TRUNCATED_NORMAL;
    c.init.b = 0.05f;
    c.init.seed = (uint64_t)i;
    c.optimizer.kind = DYNEMB_OPT_ADAGRAD;
    c.optimizer.learning_rate = 0.05f;
    c.optimizer.initial_accumulator_value = 0.1f;
    c.access_threshold = 2;
    if (dynemb_table_create(&c, &t[i])) die("create");
  }
  fclose(f);
  for (int pass = 0; pass < 2; pass++) /* every id admitted */
    for (int b = 0; b < nb; b++) phase(PREPARE, b);
  double *ph[4];
  for (int k = 0; k < 4; k++) ph[k] = calloc(rounds, sizeof(double));
  for (int r = 0; r < rounds; r++) {
    double acc[4] = {0, 0, 0, 0};
    for (int b = 0; b < nb; b++)
      for (int k = PREPARE; k <= ROUTE; k++) {
        const double t0 = cpu_ns();
        phase(k, b);
        acc[k] += cpu_ns() - t0;
        pollute(junk, pollute_bytes); /* untimed */
      }
    for (int k = 0; k < 4; k++) ph[k][r] = acc[k] / ((double)nb * per_batch);
  }
  for (int k = 0; k < 4; k++) qsort(ph[k], rounds, sizeof(double), cmp_d);
  const double p = ph[0][rounds / 2], l = ph[1][rounds / 2],
               a = ph[2][rounds / 2], rt = ph[3][rounds / 2];
  printf("{\"benchmark\": \"step_costs\", \"unit\": \"CPU ns per id\", "
         "\"ids_per_batch\": %zu, \"tables\": %d, \"batches\": %d, "
         "\"prepare\": %.2f, \"lookup_prepared\": %.2f, "
         "\"apply_prepared\": %.2f, \"ms_per_batch\": %.3f, "
         "\"route_2_owners\": %.2f, \"pollute_mb\": %zu}\n",
         per_batch, nt, nb, p, l, a, (p + l + a) * per_batch / 1e6, rt,
         pollute_bytes >> 20);
  return 0;
}
