/*
 * mpi_check.h -- check.h for the tests under mpirun: each rank's failures
 * of a test are summed to rank 0, which alone prints the test's PASS/FAIL
 * line (tests/run_all.sh counts those), so that a check that fails on one
 * rank fails the test once.
 */
#ifndef DYNEMB_MPI_CHECK_H
#define DYNEMB_MPI_CHECK_H

#include <mpi.h>
#include <stdio.h>

#include "check.h"

static int RANK, SIZE;

#define MPI_RUN(test)                                                      \
  do {                                                                     \
    if (!check_selected(#test)) break;                                     \
    check_failed_in_test = 0;                                              \
    test();                                                                \
    int all_ = 0;                                                          \
    MPI_Allreduce(&check_failed_in_test, &all_, 1, MPI_INT, MPI_SUM,       \
                  MPI_COMM_WORLD);                                         \
    if (all_) check_failed_total++; else check_passed_total++;             \
    if (RANK == 0) printf("%s %s (%d ranks)\n", all_ ? "FAIL" : "PASS",   \
                          #test, SIZE);                                    \
    fflush(stdout);                                                        \
  } while (0)

/* MPI with the threads the exchange needs, and this rank's place. */
static inline void mpi_check_init(void) {
  int provided = 0;
  MPI_Init_thread(NULL, NULL, MPI_THREAD_MULTIPLE, &provided);
  MPI_Comm_rank(MPI_COMM_WORLD, &RANK);
  MPI_Comm_size(MPI_COMM_WORLD, &SIZE);
}

/* The summary line (rank 0's); main's exit status. */
static inline int mpi_check_summary(void) {
  if (RANK == 0)
    printf("%d passed, %d failed\n", check_passed_total, check_failed_total);
  return check_failed_total ? 1 : 0;
}

#endif
