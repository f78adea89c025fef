/*
 * mpi_exchange.c -- dynemb_comm under mpirun (tests/run_all.sh runs it on 2
 * and 3 ranks, each run under a timeout).
 *
 * Every payload is a function of (source, destination, channel, exchange
 * number, byte position) that the receiver recomputes, so a byte delivered
 * to the wrong exchange, from the wrong rank or at the wrong offset fails.
 * The stress test is the design's proof: each rank runs many channels at
 * once, each on a thread of its own and begun in an order of the rank's
 * own (the thread differs by rank, the order by rank and by round), as
 * TensorFlow's scheduler may; it must finish with every byte right. The
 * asynchronous form gets the schedule that deadlocks the blocking one (one
 * thread per rank, all channels begun in the rank's own order). The fault
 * tests have ranks wait in different exchanges (a fast error naming both
 * operations) and for ranks that stay away (a bounded one); those of dead
 * and frozen ranks are mpi_faults.c. Each rank's failures are summed to
 * rank 0, which alone prints the PASS/FAIL lines.
 */
#include <mpi.h>
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "mpi_check.h"
#include "dynemb_comm.h"

static dynemb_comm *C;

static unsigned char pattern(int src, int dst, uint32_t ch, uint64_t seq,
                             size_t i) {
  uint64_t x = (uint64_t)src * 1000003u ^ (uint64_t)dst * 7919u ^
               (uint64_t)ch * 104729u ^ seq * 31u ^ i * 2654435761u;
  return (unsigned char)(x ^ x >> 11 ^ x >> 23);
}

/* Bytes rank src sends rank dst in exchange seq of ch: varied, some 0, and
 * every 7th exchange large enough for MPI's rendezvous protocol. */
static size_t part_len(int src, int dst, uint32_t ch, uint64_t seq) {
  uint64_t s = ((uint64_t)src * 131 + (uint64_t)dst * 17 + ch * 7 + seq) | 1;
  size_t len = (size_t)(check_xorshift(&s) % 3000);
  if (seq % 5 == 3) len = 0;
  if (seq % 7 == 6) len += 300000;
  return len;
}

/* This rank's parts for exchange seq of ch, in one malloc'd buffer, with
 * their offsets and lengths (SIZE entries each). */
static unsigned char *parts_to_send(uint32_t ch, uint64_t seq, size_t *soff,
                                    size_t *slen) {
  size_t total = 0;
  for (int p = 0; p < SIZE; p++) {
    soff[p] = total;
    slen[p] = part_len(RANK, p, ch, seq);
    total += slen[p];
  }
  unsigned char *send = malloc(total ? total : 1);
  for (int p = 0; p < SIZE; p++)
    for (size_t i = 0; i < slen[p]; i++)
      send[soff[p] + i] = pattern(RANK, p, ch, seq, i);
  return send;
}

/* The number of wrong things in what exchange seq of ch delivered (rc and
 * err as the exchange returned them); 0: all right. */
static int received_wrong(uint32_t ch, uint64_t seq, int rc, const void *recv,
                          const size_t *roff, const size_t *rlen,
                          const char *err) {
  if (rc) {
    fprintf(stderr, "rank %d: %s\n", RANK, err);
    return 1;
  }
  const unsigned char *r = recv;
  size_t at = 0;
  int bad = 0;
  for (int p = 0; p < SIZE; p++) {
    if (rlen[p] != part_len(p, RANK, ch, seq) || roff[p] != at) {
      bad++;
      continue;
    }
    for (size_t i = 0; i < rlen[p]; i++)
      if (r[roff[p] + i] != pattern(p, RANK, ch, seq, i)) {
        bad++;
        break;
      }
    at += rlen[p];
  }
  return bad;
}

/* One exchange on ch with the patterns; returns the number of wrong
 * things (0: all right). */
static int exchange_checked(dynemb_comm *c, uint32_t ch, uint64_t seq) {
  size_t *soff = calloc((size_t)SIZE, sizeof *soff);
  size_t *slen = calloc((size_t)SIZE, sizeof *slen);
  size_t *roff = calloc((size_t)SIZE, sizeof *roff);
  size_t *rlen = calloc((size_t)SIZE, sizeof *rlen);
  unsigned char *send = parts_to_send(ch, seq, soff, slen);
  void *recv = NULL;
  char err[512];
  int rc = dynemb_comm_alltoallv(c, ch, send, soff, slen, &recv, roff, rlen,
                                 err, sizeof err);
  int bad = received_wrong(ch, seq, rc, recv, roff, rlen, err);
  free(recv);
  free(send);
  free(soff);
  free(slen);
  free(roff);
  free(rlen);
  return bad;
}

static void test_ranks(void) {
  int r, s;
  MPI_Comm_rank(MPI_COMM_WORLD, &r);
  MPI_Comm_size(MPI_COMM_WORLD, &s);
  CHECK(dynemb_comm_rank(C) == r);
  CHECK(dynemb_comm_size(C) == s);
  CHECK(dynemb_comm_local_size(C) == s); /* one host in the tests */
}

static void test_exchange_equals_reference(void) {
  uint64_t before = dynemb_comm_bytes_sent(C);
  uint64_t want = 0;
  for (uint64_t seq = 0; seq < 20; seq++) {
    CHECK(exchange_checked(C, 42, seq) == 0);
    for (int p = 0; p < SIZE; p++)
      if (p != RANK) want += part_len(RANK, p, 42, seq);
  }
  CHECK(dynemb_comm_bytes_sent(C) - before == want);
}

enum { CHANNELS = 12, ROUNDS = 60 };
static int stress_bad[CHANNELS];

/* Thread t of this rank runs channel 1000 + (t + RANK) % CHANNELS: another
 * thread than on the other ranks, with random pauses, so the ranks start
 * the channels' exchanges in orders of their own. One thread per channel is
 * the contract's model of TensorFlow (an op waiting in its exchange holds
 * its thread, and a rank whose every thread waits on exchanges that the
 * other rank has not begun would wait for ever, whatever the transport):
 * the graph must let each rank begin every exchange without waiting on
 * another exchange of a different order. */
static void *stress_thread(void *arg) {
  int t = (int)(intptr_t)arg;
  uint64_t rng = 0x9e3779b97f4a7c15u ^ (uint64_t)(RANK * 977 + t * 13 + 1);
  uint32_t ch = 1000u + (uint32_t)((t + RANK) % CHANNELS);
  for (uint64_t round = 0; round < ROUNDS; round++) {
    struct timespec ts = {0, (long)(check_xorshift(&rng) % 200000)};
    nanosleep(&ts, NULL);
    stress_bad[t] += exchange_checked(C, ch, round);
  }
  return NULL;
}

static void test_any_order_on_any_thread(void) {
  pthread_t th[CHANNELS];
  for (int t = 0; t < CHANNELS; t++) {
    stress_bad[t] = 0;
    pthread_create(&th[t], NULL, stress_thread, (void *)(intptr_t)t);
  }
  for (int t = 0; t < CHANNELS; t++) pthread_join(th[t], NULL);
  for (int t = 0; t < CHANNELS; t++) CHECK(stress_bad[t] == 0);
}

/* The asynchronous form: one thread per rank begins all channels of a round
 * in an order of the rank's own, without waiting for any, then waits for
 * their done calls. This is the schedule that deadlocks the blocking call
 * (a rank's only thread waiting in a channel the other rank begins later)
 * and the one TensorFlow's asynchronous kernels produce. */
typedef struct async_round {
  pthread_mutex_t mu;
  pthread_cond_t cv;
  int outstanding, bad;
} async_round;

typedef struct async_call {
  async_round *round;
  uint32_t ch;
  uint64_t seq;
} async_call;

static void async_done(void *arg, int rc, void *recv, const size_t *roff,
                       const size_t *rlen, const char *err) {
  async_call *a = arg;
  int bad = received_wrong(a->ch, a->seq, rc, recv, roff, rlen, err);
  free(recv);
  pthread_mutex_lock(&a->round->mu);
  a->round->bad += bad;
  a->round->outstanding--;
  pthread_cond_signal(&a->round->cv);
  pthread_mutex_unlock(&a->round->mu);
}

static void test_async_any_order_on_one_thread(void) {
  uint64_t rng = 0x51ed270b27e4f1b5u ^ (uint64_t)(RANK + 1) * 7777;
  uint32_t order[CHANNELS];
  for (int k = 0; k < CHANNELS; k++) order[k] = 2000u + (uint32_t)k;
  async_call calls[CHANNELS];
  int bad = 0;
  if (SIZE > 8) { /* the parts' arrays below */
    CHECK(SIZE <= 8);
    return;
  }
  for (uint64_t round = 0; round < ROUNDS; round++) {
    for (int i = CHANNELS - 1; i > 0; i--) {
      int j = (int)(check_xorshift(&rng) % (uint64_t)(i + 1));
      uint32_t tmp = order[i];
      order[i] = order[j];
      order[j] = tmp;
    }
    async_round r = {.outstanding = CHANNELS};
    pthread_mutex_init(&r.mu, NULL);
    pthread_cond_init(&r.cv, NULL);
    for (int i = 0; i < CHANNELS; i++) {
      calls[i] = (async_call){.round = &r, .ch = order[i], .seq = round};
      size_t soff[8], slen[8];
      unsigned char *send = parts_to_send(order[i], round, soff, slen);
      char err[512];
      if (dynemb_comm_alltoallv_async(C, order[i], send, soff, slen, async_done,
                                      &calls[i], err, sizeof err)) {
        fprintf(stderr, "rank %d: %s\n", RANK, err);
        bad++;
        pthread_mutex_lock(&r.mu);
        r.outstanding--;
        pthread_mutex_unlock(&r.mu);
      }
      free(send); /* copied by the call */
    }
    pthread_mutex_lock(&r.mu);
    while (r.outstanding) pthread_cond_wait(&r.cv, &r.mu);
    bad += r.bad;
    pthread_mutex_unlock(&r.mu);
    pthread_mutex_destroy(&r.mu);
    pthread_cond_destroy(&r.cv);
  }
  CHECK(bad == 0);
}

/* Rank 0 runs an exchange on channel 7, the others on channel 8, as when
 * one rank's input ran out and it went on to evaluate: a deadlock that
 * every rank must see within a few seconds (the exchange timeout is 30 s),
 * naming both operations. Each rank labels only the channel it uses: the
 * label of the other side comes with its status messages. */
static void test_different_exchanges_fail_fast(void) {
  dynemb_comm *f = NULL;
  char err[1024];
  CHECK(dynemb_comm_open(&f, 30.0, err, sizeof err) == 0);
  if (!f) return;
  const uint32_t mine = RANK == 0 ? 7 : 8;
  CHECK(dynemb_comm_label(f, mine, RANK == 0 ? "op seven (train)" : "op eight (eval)",
                          2, err, sizeof err) == 0);
  CHECK(dynemb_comm_label(f, mine, "x", 0, err, sizeof err) == -1);
  size_t *z = calloc((size_t)SIZE, sizeof *z), *ro = calloc((size_t)SIZE, sizeof *ro),
         *rl = calloc((size_t)SIZE, sizeof *rl);
  char one = 1;
  void *recv = NULL;
  double t0 = MPI_Wtime();
  int rc = dynemb_comm_alltoallv(f, mine, &one, z, z, &recv, ro, rl, err,
                                 sizeof err);
  double took = MPI_Wtime() - t0;
  CHECK(rc == -1);
  CHECK(took < 6.0);
  if (rc == -1 && !(strstr(err, "op seven (train), run 0") &&
                    strstr(err, "op eight (eval), run 0") &&
                    strstr(err, "different exchanges"))) {
    fprintf(stderr, "rank %d: message '%s' lacks an operation\n", RANK, err);
    CHECK(0);
  }
  /* After a failed exchange the ranks' channels disagree: every later one
   * fails at once, naming the first failure, instead of at its deadline. */
  t0 = MPI_Wtime();
  rc = dynemb_comm_alltoallv(f, 9, &one, z, z, &recv, ro, rl, err, sizeof err);
  CHECK(rc == -1 && MPI_Wtime() - t0 < 0.5);
  CHECK(strstr(err, "an earlier exchange failed") && strstr(err, "op seven"));
  free(recv);
  free(z);
  free(ro);
  free(rl);
  MPI_Barrier(MPI_COMM_WORLD);
  dynemb_comm_close(f);
}

/* Rank 0 waits on channel 9, which the others, alive, never begin: busy is
 * no fault, but the wait ends after 5 x the timeout, saying so. */
static void test_absent_rank_is_a_bounded_error(void) {
  dynemb_comm *f = NULL;
  char err[1024];
  CHECK(dynemb_comm_open(&f, 0.4, err, sizeof err) == 0);
  if (!f) return;
  if (RANK == 0) {
    size_t *z = calloc((size_t)SIZE, sizeof *z), *ro = calloc((size_t)SIZE, sizeof *ro),
           *rl = calloc((size_t)SIZE, sizeof *rl);
    char one = 1;
    void *recv = NULL;
    double t0 = MPI_Wtime();
    int rc = dynemb_comm_alltoallv(f, 9, &one, z, z, &recv, ro, rl, err,
                                   sizeof err);
    double took = MPI_Wtime() - t0;
    CHECK(rc == -1);
    CHECK(took >= 1.9 && took < 6.0);
    if (rc == -1 && !(strstr(err, SIZE > 2 ? "for rank 1, 2, alive but not joining"
                                           : "for rank 1, alive but not joining") &&
                      strstr(err, "rank 1: alive, in no exchange"))) {
      fprintf(stderr, "rank %d: message '%s' lacks the absent ranks\n", RANK, err);
      CHECK(0);
    }
    free(recv);
    free(z);
    free(ro);
    free(rl);
  }
  MPI_Barrier(MPI_COMM_WORLD); /* (the others wait here, alive) */
  dynemb_comm_close(f);
}

static void test_bad_timeout_refused(void) {
  dynemb_comm *f = NULL;
  char err[256] = "";
  CHECK(dynemb_comm_open(&f, 0, err, sizeof err) == -1);
  CHECK(f == NULL);
  CHECK(strstr(err, "timeout") != NULL);
}

int main(void) {
  char err[512];
  if (dynemb_comm_open(&C, 20.0, err, sizeof err)) {
    fprintf(stderr, "dynemb_comm_open: %s\n", err);
    return 1;
  }
  RANK = dynemb_comm_rank(C);
  SIZE = dynemb_comm_size(C);
  MPI_RUN(test_ranks);
  MPI_RUN(test_exchange_equals_reference);
  MPI_RUN(test_any_order_on_any_thread);
  MPI_RUN(test_async_any_order_on_one_thread);
  MPI_RUN(test_different_exchanges_fail_fast);
  MPI_RUN(test_absent_rank_is_a_bounded_error);
  MPI_RUN(test_bad_timeout_refused);
  int rc = mpi_check_summary();
  dynemb_comm_close(C);
  return rc;
}
