/*
 * dynemb_comm.h -- the exchange between worker processes (MPI), kept out of
 * the engine: libdynemb stays MPI-free and one worker needs no MPI.
 *
 * Why channels instead of MPI's collectives: TensorFlow runs the ops of a
 * step on several threads in any order, so two ranks can reach two lookups'
 * exchanges in opposite orders. Collectives on one communicator must be
 * issued in the same order by every rank, and such a schedule deadlocks. An
 * exchange here is an all-to-all written as point-to-point messages whose
 * MPI tag is the exchange's *channel* (one per exchange point of the graph:
 * a lookup's forward, its gradients, ...). MPI matches messages by source
 * and tag and keeps messages of one source and tag in order, so exchanges on
 * different channels can run in any order and on any threads on each rank,
 * and the k-th exchange of a channel on one rank meets the k-th on every
 * other rank. The contract: every rank runs the same exchanges of each
 * channel in the same order, one at a time per channel.
 *
 * Every message starts with a header (channel, sequence number), so a tag
 * shared by two channels or a rank that skipped an exchange is an error, not
 * wrong rows.
 *
 * Faults. Each rank tells every peer, about once a second and from a thread
 * of its own (so a rank busy computing still does), which exchanges it waits
 * in and for whom (status.c). A wait therefore ends in an error:
 *  - when a rank it waits for has sent nothing for `timeout_s` (it died,
 *    froze, or its host is unreachable), whatever stage its message is in;
 *    the error names exactly the silent ranks, and says what the others
 *    are doing;
 *  - within a few seconds when the ranks wait in different exchanges, each
 *    for one that another rank has not begun and will not begin (a cycle
 *    that holds for two status intervals: one rank trains while another
 *    evaluates), naming the operations of both sides;
 *  - at once when a peer it waits for ended its run (dynemb_comm_close) or
 *    had an exchange fail;
 *  - after 5 x `timeout_s` when the ranks it waits for are alive but do not
 *    join (busy is no fault: a slow input or a long save on one rank).
 * A rank that died or hangs thus never hangs the others.
 *
 * Functions return 0, or -1 with a sentence in `err`.
 */
#ifndef DYNEMB_COMM_H
#define DYNEMB_COMM_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* What libdynemb_comm.so exports (it is built with hidden visibility). */
#define DYNEMB_COMM_API __attribute__((visibility("default")))

typedef struct dynemb_comm dynemb_comm;

/* Joins the world of the MPI launch (MPI_Init_thread with
 * MPI_THREAD_MULTIPLE unless the process initialised MPI already, which then
 * must have granted that level). `timeout_s` (> 0): how long a silent rank
 * is waited for (the module comment). Collective: every rank opens. */
DYNEMB_COMM_API int dynemb_comm_open(dynemb_comm **out, double timeout_s, char *err,
                     size_t err_len);

/* The comm that this process opened first and has not closed, or NULL: how
 * the op kernels of several ranks reach the world Python joined. */
DYNEMB_COMM_API dynemb_comm *dynemb_comm_world(void);

/* Ends every process of the job (MPI_Abort with `code`): what a rank does
 * when it stops on an error, so that the others, which may be waiting for
 * it, end at once instead of at their exchange's deadline. */
DYNEMB_COMM_API void dynemb_comm_abort(dynemb_comm *c, int code);

/* Ends the exchange; MPI is finalised if dynemb_comm_open initialised it.
 * Peers still waiting in an exchange for this rank's part then fail at
 * once with an error naming this rank. */
DYNEMB_COMM_API void dynemb_comm_close(dynemb_comm *c);

DYNEMB_COMM_API int dynemb_comm_rank(const dynemb_comm *c);
DYNEMB_COMM_API int dynemb_comm_size(const dynemb_comm *c);
/* Processes of this job on this host. */
DYNEMB_COMM_API int dynemb_comm_local_size(const dynemb_comm *c);

/* All-to-all of bytes on `channel`: `send_bytes[p]` bytes from
 * `send + send_offset[p]` go to rank p (p = own rank included, copied
 * locally). On success `*recv` is one malloc'd buffer (free() it; NULL when
 * nothing arrived) with rank p's bytes at recv_offset[p], recv_bytes[p]
 * long. The arrays have dynemb_comm_size entries. Thread-safe; two exchanges
 * on one channel at once is an error. */
DYNEMB_COMM_API int dynemb_comm_alltoallv(dynemb_comm *c, uint32_t channel, const void *send,
                          const size_t *send_offset, const size_t *send_bytes,
                          void **recv, size_t *recv_offset, size_t *recv_bytes,
                          char *err, size_t err_len);

/* Names the op whose exchanges run on `channel` (say "lookup of table 'u'
 * (train)"), for the errors of this rank and of its peers (which learn it
 * from the status messages); `exchanges_per_run` (>= 1) of the channel's
 * exchanges make one run of the op, so an error can say which run (about
 * the training step). The text is copied (its first 96 bytes travel); a
 * later call replaces it. Errors name unlabelled channels by number. */
DYNEMB_COMM_API int dynemb_comm_label(dynemb_comm *c, uint32_t channel,
                                      const char *label, int exchanges_per_run,
                                      char *err, size_t err_len);

/* What an asynchronous exchange calls when it has finished (on the
 * exchange's own thread): rc 0 with the parts as dynemb_comm_alltoallv
 * gives them (`recv` is the callee's to free()), or -1 with the sentence
 * in `err` (recv NULL). The arrays live only during the call. */
typedef void (*dynemb_comm_done)(void *arg, int rc, void *recv,
                                 const size_t *recv_offset,
                                 const size_t *recv_bytes, const char *err);

/* dynemb_comm_alltoallv without waiting: the parts are copied and sent
 * now, and `done` runs once every rank's part has arrived (or the
 * deadline passed). A thread that begins exchanges this way never waits
 * in one, so it can begin all of a step's exchanges in any order, and no
 * rank waits for an exchange that another rank cannot begin. (TensorFlow's
 * C API cannot host this in a kernel: the done callback that
 * TF_NewAsyncKernelBuilder's kernels receive is valid only until the kernel
 * function returns -- docs/distributed.md.) -1 (nothing sent, done never
 * runs) only when the exchange could not begin. */
DYNEMB_COMM_API int dynemb_comm_alltoallv_async(
    dynemb_comm *c, uint32_t channel, const void *send,
    const size_t *send_offset, const size_t *send_bytes,
    dynemb_comm_done done, void *arg, char *err, size_t err_len);

/* Bytes this rank has sent to other ranks (payload, headers excluded), for
 * the benchmarks' per-step volumes. */
DYNEMB_COMM_API uint64_t dynemb_comm_bytes_sent(const dynemb_comm *c);

/* Seconds threads of this rank have spent in blocking exchanges (from the
 * start of one to its end, waits for other ranks included), for the
 * benchmarks' time in MPI per step. */
DYNEMB_COMM_API double dynemb_comm_seconds(const dynemb_comm *c);

#ifdef __cplusplus
}
#endif

#endif
