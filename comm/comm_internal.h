/*
 * comm_internal.h -- what the two halves of libdynemb_comm share: the comm
 * and an exchange in flight (exchange.c moves the data, status.c tells the
 * ranks what each other is doing and judges waits that last). Not
 * installed; the API is dynemb_comm.h.
 */
#ifndef DYNEMB_COMM_INTERNAL_H
#define DYNEMB_COMM_INTERNAL_H

#include <mpi.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#include "dynemb_comm.h"

typedef struct channel_state {
  uint32_t channel;
  int busy;
  uint64_t seq;   /* exchanges begun on this channel */
  char *label;    /* dynemb_comm_label's text, or NULL */
  int per_run;    /* exchanges per run of the op (>= 1) */
} channel_state;

/* A peer's latest status message (status.c), as it arrived. */
typedef struct peer_status {
  double arrived;    /* MPI_Wtime of its arrival; the open time at first */
  uint64_t number;   /* the sender's count, so an older one never wins */
  unsigned char *msg; /* NULL until one arrived */
  size_t len;
  /* a receive of this peer's next status still in progress */
  MPI_Request req;
  unsigned char *rbuf;
  size_t rcount;
  /* this rank's last status to the peer, until MPI has taken it */
  MPI_Request sreq;
  unsigned char *sbuf;
} peer_status;

/* One exchange in flight: posted by the caller's thread, completed by
 * whichever thread progresses it (the caller's own in the blocking call,
 * the progress thread for asynchronous ones). `waiting`, read by the status
 * thread while the owner clears it, is atomic for that. */
typedef struct exchange {
  struct exchange *next;             /* the async list */
  struct exchange *fl_prev, *fl_next; /* the in-flight list (mu) */
  uint32_t channel;
  uint64_t seq;
  int tag, n, me;
  MPI_Request *sreq, *rreq;
  char **sbuf, **rbuf;
  size_t *rlen;
  _Atomic unsigned char *waiting; /* part not yet seen: peer not begun */
  unsigned char *sending, *recving; /* send not taken; part on its way */
  int left, sends_left;
  double begun;     /* MPI_Wtime at post */
  double next_look; /* when status_judge looks next */
  char *own; /* this rank's part for itself, copied */
  size_t own_len;
  double idle; /* since when no progress (backoff) */
  dynemb_comm_done done;
  void *arg;
  char err[1024];
} exchange;

struct dynemb_comm {
  MPI_Comm world;  /* a duplicate: our tags never meet the script's */
  MPI_Comm status_world; /* another one, for status messages alone */
  int rank, size, local_size;
  int tag_ub;
  int owns_mpi;
  double timeout_s;
  double interval_s; /* between two status messages */
  pthread_mutex_t mu; /* guards the channel table and the in-flight list */
  channel_state *ch;
  size_t n_ch, cap_ch;
  exchange *flight; /* every exchange in flight */
  _Atomic uint64_t bytes_sent;
  _Atomic uint64_t exchange_ns; /* time in blocking exchanges */
  /* Set by the first exchange that failed for a peer (deadline, wrong
   * sequence): the ranks' channels no longer agree, so every later exchange
   * fails at once with this error instead of waiting for its own deadline
   * (TensorFlow may start other exchange ops of a failed step). The failed
   * exchange stays in this rank's status messages (`failed`), so that its
   * peers learn it will not join anything any more. */
  int broken; /* guarded by mu */
  char broken_err[1024];
  unsigned char *failed; /* the failed exchange's status entry, or NULL */
  size_t failed_len;
  /* Status messages (status.c): the peers' latest, guarded by status_mu;
   * one thread at a time receives them (drain_mu, taken by trylock). */
  pthread_mutex_t status_mu, drain_mu;
  peer_status *peers;
  uint64_t status_number;
  double next_status;
  /* The progress thread: sends status messages and finishes asynchronous
   * exchanges. */
  pthread_mutex_t pending_mu;
  pthread_cond_t pending_cv;
  struct exchange *pending; /* a list; the thread owns the entries */
  pthread_t progress;
  int progress_started, stopping;
};

int dynemb_comm_fail(char *err, size_t err_len, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* status.c */
int status_init(dynemb_comm *c); /* 0, or -1: out of memory */
void status_fini(dynemb_comm *c);
/* Sends this rank's status to every peer when one is due, and takes the
 * peers' (the progress thread, at every turn). */
void status_tick(dynemb_comm *c);
/* Called by a wait that made no progress: 0 to wait on, or -1 with the
 * sentence in x->err (a silent rank, ranks in different exchanges, a peer
 * that failed, or a rank that stays away too long). */
int status_judge(dynemb_comm *c, exchange *x);
/* "lookup of table 't' (train), run 3 (exchange 7 of channel 17)": x's
 * op, for errors (takes mu). */
void status_op(dynemb_comm *c, const exchange *x, char *buf, size_t len);
/* x's status entry (the caller holds mu), for `failed`; malloc'd. */
unsigned char *status_entry(dynemb_comm *c, const exchange *x, double now,
                            size_t *len);
/* What the op on `channel` is called, "" when nobody said (the caller
 * holds mu). */
const char *status_label(dynemb_comm *c, uint32_t channel, char *buf,
                         size_t len, int *per_run);

#endif
