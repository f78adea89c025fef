/*
 * mpi_shard.c -- the shard room (comm/shard.h) under mpirun, without
 * TensorFlow (tests/run_all.sh runs it on 2 and 3 ranks, each run under a
 * timeout).
 *
 * The reference is one process: every rank also feeds the whole global
 * batch to a table of its own through the engine directly, and the ranks'
 * sharded results must equal it bit for bit -- the rows each lookup
 * returns, which occurrences read a row, and at the end every row and
 * admission candidate, each on the rank dynemb_key_shard names. Gradients
 * are multiples of 1/8, so that sums in any grouping are exact and the
 * comparison needs no tolerance. Then: admission counts the weighted
 * sightings of all ranks in one step; ranks whose tables differ (dim,
 * optimizer) fail naming both ranks and change nothing; a peer that fails,
 * leaves or freezes makes the others fail naming it, within the timeout.
 */
#include <signal.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>
#include <unistd.h>

#include "dynemb.h"
#include "dynemb_comm.h"
#include "mpi_check.h"
#include "shard.h"

enum { DIM = 4 };

/* The comms, all opened before any closes: a comm opened after another
 * closed may get its MPI context again, and with it the closed one's
 * goodbyes. C serves every test, F (2 s timeout) the frozen rank's, and C
 * ends with the rank that leaves. */
static dynemb_comm *C, *F;
#define FROZEN_TIMEOUT_S 2.0

static dynemb_comm *open_comm(double timeout_s) {
  dynemb_comm *c = NULL;
  char err[512];
  if (dynemb_comm_open(&c, timeout_s, err, sizeof err)) {
    fprintf(stderr, "rank %d: %s\n", RANK, err);
    CHECK(0);
  }
  return c;
}

static dynemb_table *make_table(const char *name, int dim, int optimizer,
                                uint32_t threshold) {
  dynemb_table_config cfg;
  dynemb_table_config_init(&cfg);
  cfg.name = name;
  cfg.dim = dim;
  cfg.init = (dynemb_initializer){DYNEMB_INIT_UNIFORM, -1.0f, 1.0f, 7};
  cfg.optimizer.kind = optimizer;
  cfg.access_threshold = threshold;
  dynemb_table *t = NULL;
  CHECK_OK(dynemb_table_create(&cfg, &t));
  return t;
}

static void drop(dynemb_table *t) {
  if (!t) return;
  dynemb_table_drop(dynemb_table_name(t));
  dynemb_table_release(t);
}

/* The global batch of a step, the same on every rank: g keys drawn from
 * `pool` keys, negative and wide ones among them, with repeats. */
static void global_batch(int step, size_t g, int pool, int64_t *keys) {
  uint64_t s = 0x9e3779b97f4a7c15ULL * (uint64_t)(step + 1);
  for (size_t i = 0; i < g; i++) {
    int64_t k = (int64_t)(check_xorshift(&s) % (uint64_t)pool) - pool / 3;
    keys[i] = k * 1000003 + (k & 1 ? INT64_C(1) << 40 : 0);
  }
}

static float grad_of(int64_t key, int step, int d) {
  return (float)((int)(((uint64_t)key * 7 + (uint64_t)step * 3 + (uint64_t)d) % 9) - 4) *
         0.125f;
}

/* This rank's slice of a global batch of g: [*lo, *hi). */
static void slice(size_t g, size_t *lo, size_t *hi) {
  *lo = g * (size_t)RANK / (size_t)SIZE;
  *hi = g * (size_t)(RANK + 1) / (size_t)SIZE;
}

/* The sharded table's part on this rank equals the reference's rows and
 * candidates of the keys this rank owns, and the parts add up to it. */
static void check_same_tables(dynemb_table *part, dynemb_table *ref) {
  dynemb_snapshot a = {0}, b = {0};
  CHECK_OK(dynemb_table_snapshot(part, &a));
  CHECK_OK(dynemb_table_snapshot(ref, &b));
  const size_t rf = (size_t)b.row_floats;
  size_t j = 0, owned = 0;
  for (size_t i = 0; i < b.rows; i++) {
    if (dynemb_key_shard(b.keys[i], (uint32_t)SIZE) != (uint32_t)RANK) continue;
    owned++;
    if (j >= a.rows || a.keys[j] != b.keys[i]) {
      CHECK(0);
      break;
    }
    CHECK(!memcmp(a.values + j * rf, b.values + i * rf, rf * sizeof(float)));
    j++;
  }
  CHECK(owned == a.rows);
  size_t cj = 0;
  for (size_t i = 0; i < b.candidates; i++) {
    if (dynemb_key_shard(b.cand_keys[i], (uint32_t)SIZE) != (uint32_t)RANK)
      continue;
    CHECK(cj < a.candidates && a.cand_keys[cj] == b.cand_keys[i] &&
          a.cand_counts[cj] == b.cand_counts[i]);
    cj++;
  }
  CHECK(cj == a.candidates);
  CHECK(a.apply_steps == b.apply_steps);
  unsigned long long mine = a.rows, all = 0;
  MPI_Allreduce(&mine, &all, 1, MPI_UNSIGNED_LONG_LONG, MPI_SUM, MPI_COMM_WORLD);
  CHECK(all == b.rows);
  dynemb_snapshot_free(&a);
  dynemb_snapshot_free(&b);
}

/* (a) N ranks, each looking up and applying its slice of every step's
 * global batch, end as one table fed the whole batch; every lookup on the
 * way returns what one process's would. Admission after 2 sightings, so
 * that some occurrences read the default value. */
static void test_parity_with_one_process(void) {
  dynemb_comm *c = C;
  dynemb_table *t = make_table("par", DIM, DYNEMB_OPT_ADAGRAD, 2);
  dynemb_table *ref = make_table("par_ref", DIM, DYNEMB_OPT_ADAGRAD, 2);
  if (!c || !t || !ref) goto out;
  dynemb_shard_op lookup = {.kind = DYNEMB_SHARD_LOOKUP, .channel = 1,
                            .table = "par", .mode = DYNEMB_LOOKUP_TRAIN,
                            .weight = 1};
  dynemb_shard_op eval = {.kind = DYNEMB_SHARD_LOOKUP, .channel = 2,
                          .table = "par", .mode = DYNEMB_LOOKUP_EVAL};
  dynemb_shard_op apply = {.kind = DYNEMB_SHARD_APPLY, .channel = 3,
                           .table = "par"};
  enum { G = 600, STEPS = 5 };
  int64_t keys[G];
  float *rows = malloc(G * DIM * sizeof *rows);
  float *ref_rows = malloc(G * DIM * sizeof *ref_rows);
  float *grads = malloc(G * DIM * sizeof *grads);
  dynemb_ticket *tickets = malloc(G * sizeof *tickets);
  unsigned char found[G];
  size_t lo, hi;
  slice(G, &lo, &hi);
  const size_t m = hi - lo;
  dynemb_shard_error e;
  for (int step = 0; step <= STEPS; step++) {
    const int last = step == STEPS; /* then an eval lookup, no apply */
    dynemb_shard_op *op = last ? &eval : &lookup;
    global_batch(step, G, 400, keys);
    int rc = dynemb_shard_lookup(c, op, t, keys + lo, m, step + 1, rows, found,
                                 &e);
    if (rc) fprintf(stderr, "rank %d: %s\n", RANK, e.msg);
    CHECK(rc == DYNEMB_SHARD_OK);
    CHECK_OK(dynemb_lookup(ref, keys, G,
                           last ? DYNEMB_LOOKUP_EVAL : DYNEMB_LOOKUP_TRAIN,
                           step + 1, NULL, ref_rows, tickets));
    CHECK(!memcmp(rows, ref_rows + lo * DIM, m * DIM * sizeof *rows));
    int defaults = 0;
    for (size_t i = 0; i < m; i++) {
      CHECK(found[i] == (tickets[lo + i] != DYNEMB_NOT_ADMITTED));
      defaults += !found[i];
    }
    if (step == 0) CHECK(defaults > 0); /* (admission was exercised) */
    if (last) break;
    for (size_t i = 0; i < G; i++)
      for (int d = 0; d < DIM; d++) grads[i * DIM + d] = grad_of(keys[i], step, d);
    size_t applied = 0;
    CHECK(dynemb_shard_apply(c, &apply, t, keys + lo, m, grads + lo * DIM, 0.5f,
                             &applied, &e) == DYNEMB_SHARD_OK);
    CHECK_OK(dynemb_apply(ref, keys, G, grads, 0.5f, NULL, NULL));
  }
  check_same_tables(t, ref);
  free(rows);
  free(ref_rows);
  free(grads);
  free(tickets);
out:
  drop(t);
  drop(ref);
}

/* (b) A key that every rank sees once a step, each sighting weighing 2,
 * with a threshold of 2N + 1: not admitted after one step (2N sightings),
 * admitted at the first occurrence of the second; a key that only the
 * last rank sees, three times a step, as one process counts it. */
static void test_admission_counts_across_ranks(void) {
  dynemb_comm *c = C;
  const uint32_t threshold = 2 * (uint32_t)SIZE + 1;
  dynemb_table *t = make_table("adm", DIM, DYNEMB_OPT_SGD, threshold);
  dynemb_table *ref = make_table("adm_ref", DIM, DYNEMB_OPT_SGD, threshold);
  if (!c || !t || !ref) goto out;
  dynemb_shard_op op = {.kind = DYNEMB_SHARD_LOOKUP, .channel = 4,
                        .table = "adm", .mode = DYNEMB_LOOKUP_TRAIN,
                        .weight = 2};
  const int64_t everyone = 1000, alone = 2000;
  const int64_t mine_last[4] = {everyone, alone, alone, alone};
  const int is_last = RANK == SIZE - 1;
  const size_t m = is_last ? 4 : 1;
  /* the global batch: one `everyone` per rank, the last rank's three
   * `alone` after its own */
  const size_t g = (size_t)SIZE + 3;
  int64_t *all = malloc(g * sizeof *all);
  for (int r = 0; r < SIZE; r++) all[r] = everyone;
  for (size_t i = 0; i < 3; i++) all[SIZE + i] = alone;
  dynemb_ticket *tickets = malloc(g * sizeof *tickets);
  float rows[4 * DIM], *ref_rows = malloc(g * DIM * sizeof *ref_rows);
  unsigned char found[4];
  dynemb_shard_error e;
  for (int step = 0; step < 2; step++) {
    CHECK(dynemb_shard_lookup(c, &op, t, mine_last, m, 1, rows, found, &e) ==
          DYNEMB_SHARD_OK);
    CHECK(found[0] == (step == 1)); /* `everyone`, on every rank */
    CHECK_OK(dynemb_lookup(ref, all, g, DYNEMB_LOOKUP_TRAIN, 1,
                           &(dynemb_lookup_opts){.weight = 2}, ref_rows,
                           tickets));
    /* this rank's occurrences in the concatenated batch: `everyone` at
     * RANK, and the last rank's `alone`s at the end */
    CHECK(found[0] == (tickets[RANK] != DYNEMB_NOT_ADMITTED));
    for (size_t i = 1; i < m; i++)
      CHECK(found[i] == (tickets[SIZE + i - 1] != DYNEMB_NOT_ADMITTED));
    if (step == 0 &&
        dynemb_key_shard(everyone, (uint32_t)SIZE) == (uint32_t)RANK) {
      dynemb_snapshot s = {0};
      CHECK_OK(dynemb_table_snapshot(t, &s));
      int counted = 0;
      for (size_t i = 0; i < s.candidates; i++)
        if (s.cand_keys[i] == everyone)
          counted = s.cand_counts[i] == 2 * (uint32_t)SIZE;
      CHECK(counted);
      dynemb_snapshot_free(&s);
    }
  }
  check_same_tables(t, ref);
  free(all);
  free(tickets);
  free(ref_rows);
out:
  drop(t);
  drop(ref);
}

/* Whether a failure names this rank's and the other rank's settings, in
 * either order of the two ranks. */
static int names_both(const char *msg, const char *mine, const char *theirs,
                      int other) {
  char a[96], b[96];
  snprintf(a, sizeof a, "%s on rank %d", mine, RANK);
  snprintf(b, sizeof b, "%s on rank %d", theirs, other);
  int ok = strstr(msg, a) && strstr(msg, b);
  if (!ok) fprintf(stderr, "rank %d: '%s' lacks '%s' or '%s'\n", RANK, msg, a, b);
  return ok;
}

/* (c) The last rank's table has another dim, then another optimizer, then
 * other hyper-parameters: every rank fails, naming both ranks' settings,
 * and no row changes. */
static void test_mismatched_tables_fail_naming_both(void) {
  dynemb_comm *c = C;
  if (!c) return;
  const int odd = RANK == SIZE - 1;
  const int other = odd ? 0 : SIZE - 1;
  int64_t keys[64];
  float rows[64 * 8], grads[64 * 8] = {0.5f};
  unsigned char found[64];
  for (int i = 0; i < 64; i++) keys[i] = i; /* (every rank owns some) */
  dynemb_shard_error e;
  /* dim */
  dynemb_table *t = make_table("mis_dim", odd ? 8 : DIM, DYNEMB_OPT_SGD, 0);
  dynemb_shard_op lookup = {.kind = DYNEMB_SHARD_LOOKUP, .channel = 5,
                            .table = "mis_dim", .weight = 1};
  dynemb_shard_op apply = {.kind = DYNEMB_SHARD_APPLY, .channel = 6,
                           .table = "mis_dim"};
  CHECK(dynemb_shard_lookup(c, &lookup, t, keys, 64, 1, rows, found, &e) ==
        DYNEMB_SHARD_EMISMATCH);
  CHECK(names_both(e.msg, odd ? "dim 8" : "dim 4", odd ? "4" : "8", other));
  CHECK(dynemb_shard_apply(c, &apply, t, keys, 64, grads, 0.5f, NULL, &e) ==
        DYNEMB_SHARD_EMISMATCH);
  CHECK(names_both(e.msg, odd ? "dim 8" : "dim 4", odd ? "4" : "8", other));
  drop(t);
  /* optimizer, then its hyper-parameters */
  for (int hyper = 0; hyper < 2; hyper++) {
    dynemb_table_config cfg;
    dynemb_table_config_init(&cfg);
    cfg.name = "mis_opt";
    cfg.dim = DIM;
    cfg.optimizer.kind = hyper || !odd ? DYNEMB_OPT_ADAM : DYNEMB_OPT_SGD;
    if (hyper && odd) cfg.optimizer.beta1 = 0.5f;
    t = NULL;
    CHECK_OK(dynemb_table_create(&cfg, &t));
    dynemb_shard_op lk = {.kind = DYNEMB_SHARD_LOOKUP,
                          .channel = 7 + 2 * (uint32_t)hyper,
                          .table = "mis_opt", .weight = 1};
    dynemb_shard_op ap = {.kind = DYNEMB_SHARD_APPLY,
                          .channel = 8 + 2 * (uint32_t)hyper,
                          .table = "mis_opt"};
    CHECK(dynemb_shard_lookup(c, &lk, t, keys, 64, 1, rows, found, &e) ==
          DYNEMB_SHARD_OK);
    CHECK(dynemb_shard_apply(c, &ap, t, keys, 64, grads, 0.5f, NULL, &e) ==
          DYNEMB_SHARD_EMISMATCH);
    if (!hyper)
      CHECK(names_both(e.msg, odd ? "optimizer sgd" : "optimizer adam",
                       odd ? "adam" : "sgd", other));
    else
      CHECK(strstr(e.msg, "other hyper-parameters") != NULL);
    dynemb_table_stats s;
    dynemb_table_get_stats(t, &s);
    CHECK(s.applied == 0 && s.apply_steps == 0); /* (no wrong rows) */
    drop(t);
  }
}

/* (d) The last rank fails before its lookup (on C), freezes (on F), then
 * leaves (C); each time the others fail naming it: at once when it failed
 * or left, after the exchange timeout when it froze (rank 0 then wakes it).
 * Ends C and F. */
static void test_dead_peer_fails_the_others_naming_it(void) {
  const int last = SIZE - 1;
  pid_t me = getpid(), *pids = calloc((size_t)SIZE, sizeof *pids);
  MPI_Allgather(&me, sizeof me, MPI_BYTE, pids, sizeof me, MPI_BYTE,
                MPI_COMM_WORLD);
  MPI_Comm healthy;
  MPI_Comm_split(MPI_COMM_WORLD, RANK == last, RANK, &healthy);
  dynemb_table *t = make_table("dead", DIM, DYNEMB_OPT_SGD, 0);
  int64_t keys[16];
  float rows[16 * DIM];
  for (int i = 0; i < 16; i++) keys[i] = i;
  enum { FAILS, FREEZES, LEAVES };
  static const char *const wants[] = {
      "rank %d failed this step", "rank %d sent nothing for",
      "rank %d ended its run without this exchange"};
  for (int how = FAILS; how <= LEAVES && C && F; how++) {
    dynemb_comm *c = how == FREEZES ? F : C;
    dynemb_shard_op op = {.kind = DYNEMB_SHARD_LOOKUP,
                          .channel = 11 + (uint32_t)how, .table = "dead",
                          .weight = 1};
    if (RANK == last) {
      if (how == FAILS) dynemb_shard_failed(c, &op);
      if (how == FREEZES) raise(SIGSTOP); /* (rank 0 wakes it) */
      if (how == LEAVES) dynemb_comm_close(c);
      MPI_Barrier(MPI_COMM_WORLD);
      continue;
    }
    dynemb_shard_error e;
    double t0 = MPI_Wtime();
    int rc = dynemb_shard_lookup(c, &op, t, keys, 16, 1, rows, NULL, &e);
    double took = MPI_Wtime() - t0;
    char want[96];
    snprintf(want, sizeof want, wants[how], last);
    CHECK(rc == (how == FAILS ? DYNEMB_SHARD_EPEER : DYNEMB_SHARD_EEXCHANGE));
    if (!strstr(e.msg, want) || !strstr(e.msg, "table 'dead'")) {
      fprintf(stderr, "rank %d: '%s' lacks '%s'\n", RANK, e.msg, want);
      CHECK(0);
    }
    if (how == FREEZES) {
      CHECK(took >= FROZEN_TIMEOUT_S - 0.5 && took < FROZEN_TIMEOUT_S + 3.0);
      MPI_Barrier(healthy); /* every healthy rank has failed: wake it */
      if (RANK == 0) kill(pids[last], SIGCONT);
    } else {
      CHECK(took < 5.0); /* (C's timeout is 30 s: it was not waited for) */
    }
    if (how == LEAVES) dynemb_comm_close(c);
    MPI_Barrier(MPI_COMM_WORLD);
  }
  dynemb_comm_close(F);
  C = F = NULL;
  drop(t);
  MPI_Comm_free(&healthy);
  free(pids);
}

int main(void) {
  mpi_check_init();
  C = open_comm(30);
  F = open_comm(FROZEN_TIMEOUT_S);
  MPI_RUN(test_parity_with_one_process);
  MPI_RUN(test_admission_counts_across_ranks);
  MPI_RUN(test_mismatched_tables_fail_naming_both);
  MPI_RUN(test_dead_peer_fails_the_others_naming_it);
  int rc = mpi_check_summary();
  dynemb_comm_close(C); /* (where the last test did not run) */
  dynemb_comm_close(F);
  MPI_Finalize();
  return rc;
}
