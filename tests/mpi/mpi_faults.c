/*
 * mpi_faults.c -- dynemb_comm when a rank freezes halfway through sending
 * (tests/run_all.sh runs it on 2 and 3 ranks, each run under a timeout).
 *
 * The last rank begins an exchange whose parts to the others are large
 * enough for MPI's rendezvous protocol (32 MiB: moved in pieces, each of
 * which needs the sender) and stops itself (SIGSTOP) at once, so the others
 * find its message begun and never finished. They must fail within the
 * exchange timeout and a little, naming exactly the frozen rank as silent
 * and the other healthy ranks as alive; then rank 0 wakes the frozen rank
 * (SIGCONT), which finishes its exchange, and all close. A receive without
 * a deadline hangs here until the run's timeout kills it.
 *
 * Each rank's failures are summed to rank 0, which alone prints the
 * PASS/FAIL lines. Set MPI_FAULTS_VERBOSE=1 to see the errors.
 */
#include <mpi.h>
#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>
#include <time.h>
#include <unistd.h>

#include "mpi_check.h"
#include "dynemb_comm.h"


enum { BIG = 32 << 20 };
#define TIMEOUT_S 3.0

typedef struct waiter {
  pthread_mutex_t mu;
  pthread_cond_t cv;
  int finished, rc;
} waiter;

static void frozen_done(void *arg, int rc, void *recv, const size_t *roff,
                        const size_t *rlen, const char *err) {
  (void)roff;
  (void)rlen;
  (void)err;
  waiter *w = arg;
  free(recv);
  pthread_mutex_lock(&w->mu);
  w->finished = 1;
  w->rc = rc;
  pthread_cond_signal(&w->cv);
  pthread_mutex_unlock(&w->mu);
}

static void test_frozen_sender_fails_the_others_naming_it(void) {
  const int frozen = SIZE - 1;
  pid_t *pids = calloc((size_t)SIZE, sizeof *pids);
  pid_t me = getpid();
  MPI_Allgather(&me, sizeof me, MPI_BYTE, pids, sizeof me, MPI_BYTE,
                MPI_COMM_WORLD);
  dynemb_comm *f = NULL;
  char err[1024];
  CHECK(dynemb_comm_open(&f, TIMEOUT_S, err, sizeof err) == 0);
  if (!f) {
    free(pids);
    return;
  }
  CHECK(dynemb_comm_label(f, 5, "lookup of table 'big' (train)", 2, err,
                          sizeof err) == 0);
  size_t *off = calloc((size_t)SIZE, sizeof *off),
         *len = calloc((size_t)SIZE, sizeof *len),
         *ro = calloc((size_t)SIZE, sizeof *ro),
         *rl = calloc((size_t)SIZE, sizeof *rl);
  char *send = calloc(1, BIG);
  for (int p = 0; p < SIZE; p++) len[p] = RANK == frozen && p != RANK ? BIG : 64;
  /* the others healthy: one exchange on the channel first */
  void *recv = NULL;
  size_t small[8] = {0}, smalllen[8];
  for (int p = 0; p < SIZE && p < 8; p++) smalllen[p] = 16;
  CHECK(SIZE <= 8);
  CHECK(dynemb_comm_alltoallv(f, 5, send, small, smalllen, &recv, ro, rl, err,
                              sizeof err) == 0);
  free(recv);
  recv = NULL;
  MPI_Comm healthy;
  MPI_Comm_split(MPI_COMM_WORLD, RANK == frozen, RANK, &healthy);
  if (RANK == frozen) {
    waiter w = {.rc = 1};
    pthread_mutex_init(&w.mu, NULL);
    pthread_cond_init(&w.cv, NULL);
    CHECK(dynemb_comm_alltoallv_async(f, 5, send, off, len, frozen_done, &w,
                                      err, sizeof err) == 0);
    raise(SIGSTOP); /* (the sends have begun; rank 0 wakes this rank) */
    struct timespec until;
    clock_gettime(CLOCK_REALTIME, &until);
    until.tv_sec += 60;
    pthread_mutex_lock(&w.mu);
    while (!w.finished &&
           pthread_cond_timedwait(&w.cv, &w.mu, &until) == 0) {
    }
    int finished = w.finished;
    pthread_mutex_unlock(&w.mu);
    CHECK(finished); /* done ran, whatever its outcome */
  } else {
    double t0 = MPI_Wtime();
    int rc = dynemb_comm_alltoallv(f, 5, send, off, len, &recv, ro, rl, err,
                                   sizeof err);
    double took = MPI_Wtime() - t0;
    if (getenv("MPI_FAULTS_VERBOSE"))
      fprintf(stderr, "rank %d after %.2f s: %s\n", RANK, took, rc ? err : "ok");
    CHECK(rc == -1);
    CHECK(took >= TIMEOUT_S - 0.5 && took < TIMEOUT_S + 3.0);
    char want[64];
    snprintf(want, sizeof want, "rank %d sent nothing for", frozen);
    CHECK(rc == -1 && strstr(err, want) != NULL);
    CHECK(rc == -1 && strstr(err, "lookup of table 'big' (train), run 0") != NULL);
    if (SIZE > 2) { /* the other healthy rank: alive, never blamed */
      char other[64];
      snprintf(other, sizeof other, "rank %d: alive", RANK == 0 ? 1 : 0);
      CHECK(rc == -1 && strstr(err, other) != NULL);
      snprintf(other, sizeof other, "rank %d sent nothing", RANK == 0 ? 1 : 0);
      CHECK(rc == -1 && strstr(err, other) == NULL);
    }
    free(recv);
    /* every healthy rank has failed: wake the frozen one */
    MPI_Barrier(healthy);
    if (RANK == 0) kill(pids[frozen], SIGCONT);
  }
  MPI_Comm_free(&healthy);
  MPI_Barrier(MPI_COMM_WORLD);
  dynemb_comm_close(f);
  free(send);
  free(off);
  free(len);
  free(ro);
  free(rl);
  free(pids);
}

int main(void) {
  mpi_check_init();
  MPI_RUN(test_frozen_sender_fails_the_others_naming_it);
  int rc = mpi_check_summary();
  MPI_Finalize();
  return rc;
}
