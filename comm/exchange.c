/*
 * exchange.c -- dynemb_comm: all-to-all exchanges on channels over MPI
 * point-to-point messages (the design and its contract: dynemb_comm.h).
 *
 * One message per peer and exchange: a header (channel, sequence number)
 * and the payload in one buffer. Receives use matched probes
 * (MPI_Improbe/MPI_Imrecv), the thread-safe way to receive a message whose
 * size is not known in advance, so no size round trip precedes the data.
 * Nothing here blocks in MPI: waits poll, so a message whose sender dies or
 * freezes halfway (a large one moves in pieces, each needing the sender)
 * is an error like any other silence, never a hang. Asynchronous exchanges
 * are finished by one progress thread per comm, which polls every pending
 * exchange in turn, so none waits for another; the same thread sends this
 * rank's status messages (status.c), which decide when a wait fails.
 */
#include <mpi.h>
#include <pthread.h>
#include <sched.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "comm_internal.h"

typedef struct header {
  uint32_t channel;
  uint32_t reserved;
  uint64_t seq;
} header;

/* The tag of the message a rank sends every peer when it leaves (channels
 * start at 1): a rank still waiting for its part then fails at once, naming
 * it, instead of at its deadline (a rank whose input ended first, say). */
#define GOODBYE_TAG 0

/* dynemb_comm_world's answer. */
static _Atomic(dynemb_comm *) the_world;

int dynemb_comm_fail(char *err, size_t err_len, const char *fmt, ...) {
  if (err && err_len) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err, err_len, fmt, ap);
    va_end(ap);
  }
  return -1;
}
#define fail dynemb_comm_fail

static void *progress_main(void *arg);

int dynemb_comm_open(dynemb_comm **out, double timeout_s, char *err,
                     size_t err_len) {
  *out = NULL;
  if (!(timeout_s > 0))
    return fail(err, err_len,
                "exchange timeout must be > 0 seconds, got %g", timeout_s);
  int inited = 0, provided = 0, owns = 0;
  MPI_Initialized(&inited);
  if (!inited) {
    if (MPI_Init_thread(NULL, NULL, MPI_THREAD_MULTIPLE, &provided) !=
        MPI_SUCCESS)
      return fail(err, err_len, "MPI_Init_thread failed");
    owns = 1;
  } else {
    MPI_Query_thread(&provided);
  }
  if (provided < MPI_THREAD_MULTIPLE) {
    if (owns) MPI_Finalize();
    return fail(err, err_len,
                "the MPI library grants thread level %d, dynemb needs "
                "MPI_THREAD_MULTIPLE (%d): TensorFlow runs exchanges on "
                "several threads; initialise MPI with MPI_THREAD_MULTIPLE "
                "(mpi4py: mpi4py.rc.thread_level = 'multiple')",
                provided, MPI_THREAD_MULTIPLE);
  }
  dynemb_comm *c = calloc(1, sizeof *c);
  if (!c) {
    if (owns) MPI_Finalize();
    return fail(err, err_len, "out of memory");
  }
  c->owns_mpi = owns;
  c->timeout_s = timeout_s;
  MPI_Comm_dup(MPI_COMM_WORLD, &c->world);
  MPI_Comm_dup(MPI_COMM_WORLD, &c->status_world);
  MPI_Comm_rank(c->world, &c->rank);
  MPI_Comm_size(c->world, &c->size);
  MPI_Comm local;
  MPI_Comm_split_type(c->world, MPI_COMM_TYPE_SHARED, c->rank, MPI_INFO_NULL,
                      &local);
  MPI_Comm_size(local, &c->local_size);
  MPI_Comm_free(&local);
  int *ub = NULL, flag = 0;
  MPI_Comm_get_attr(c->world, MPI_TAG_UB, &ub, &flag);
  c->tag_ub = flag && ub ? *ub : 32767; /* the standard's minimum */
  pthread_mutex_init(&c->mu, NULL);
  pthread_mutex_init(&c->pending_mu, NULL);
  pthread_condattr_t ca;
  pthread_condattr_init(&ca);
  pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
  pthread_cond_init(&c->pending_cv, &ca);
  pthread_condattr_destroy(&ca);
  /* The status thread runs from the start: a rank is seen alive before its
   * first exchange (the others may wait for it in theirs). */
  if (status_init(c) ||
      pthread_create(&c->progress, NULL, progress_main, c)) {
    c->progress_started = 0;
    fail(err, err_len, "out of memory, or no thread for the exchange");
    dynemb_comm_close(c);
    return -1;
  }
  c->progress_started = 1;
  dynemb_comm *none = NULL;
  atomic_compare_exchange_strong(&the_world, &none, c);
  *out = c;
  return 0;
}

dynemb_comm *dynemb_comm_world(void) { return atomic_load(&the_world); }

void dynemb_comm_close(dynemb_comm *c) {
  if (!c) return;
  dynemb_comm *self = c;
  atomic_compare_exchange_strong(&the_world, &self, NULL);
  if (c->progress_started) {
    pthread_mutex_lock(&c->pending_mu);
    c->stopping = 1;
    pthread_cond_signal(&c->pending_cv);
    pthread_mutex_unlock(&c->pending_mu);
    pthread_join(c->progress, NULL);
  }
  status_fini(c);
  /* Goodbye to every peer (0-byte, eager: complete at once) before MPI's
   * finalize, which may wait for the others. */
  for (int p = 0; p < c->size; p++) {
    if (p == c->rank) continue;
    MPI_Request req;
    MPI_Isend(NULL, 0, MPI_BYTE, p, GOODBYE_TAG, c->world, &req);
    MPI_Request_free(&req);
  }
  MPI_Comm_free(&c->world);
  MPI_Comm_free(&c->status_world);
  pthread_mutex_destroy(&c->mu);
  pthread_mutex_destroy(&c->pending_mu);
  pthread_cond_destroy(&c->pending_cv);
  int owns = c->owns_mpi;
  for (size_t i = 0; i < c->n_ch; i++) free(c->ch[i].label);
  free(c->ch);
  free(c->failed);
  free(c);
  if (owns) MPI_Finalize();
}

void dynemb_comm_abort(dynemb_comm *c, int code) { MPI_Abort(c->world, code); }

int dynemb_comm_rank(const dynemb_comm *c) { return c->rank; }
int dynemb_comm_size(const dynemb_comm *c) { return c->size; }
int dynemb_comm_local_size(const dynemb_comm *c) { return c->local_size; }
double dynemb_comm_seconds(const dynemb_comm *c) {
  return 1e-9 * (double)atomic_load(&((dynemb_comm *)c)->exchange_ns);
}

uint64_t dynemb_comm_bytes_sent(const dynemb_comm *c) {
  return atomic_load(&((dynemb_comm *)c)->bytes_sent);
}

/* The channel's entry, made when missing (the caller holds mu); NULL: out
 * of memory. */
static channel_state *channel_find(dynemb_comm *c, uint32_t channel) {
  for (size_t i = 0; i < c->n_ch; i++)
    if (c->ch[i].channel == channel) return &c->ch[i];
  if (c->n_ch == c->cap_ch) {
    size_t cap = c->cap_ch ? 2 * c->cap_ch : 16;
    channel_state *grown = realloc(c->ch, cap * sizeof *grown);
    if (!grown) return NULL;
    c->ch = grown;
    c->cap_ch = cap;
  }
  channel_state *s = &c->ch[c->n_ch++];
  *s = (channel_state){.channel = channel, .per_run = 1};
  return s;
}

int dynemb_comm_label(dynemb_comm *c, uint32_t channel, const char *label,
                      int exchanges_per_run, char *err, size_t err_len) {
  if (exchanges_per_run < 1)
    return fail(err, err_len, "exchanges_per_run must be >= 1, got %d",
                exchanges_per_run);
  char *copy = strdup(label ? label : "");
  pthread_mutex_lock(&c->mu);
  channel_state *s = copy ? channel_find(c, channel) : NULL;
  if (s) {
    free(s->label);
    s->label = copy;
    s->per_run = exchanges_per_run;
  }
  pthread_mutex_unlock(&c->mu);
  if (!s) {
    free(copy);
    return fail(err, err_len, "out of memory");
  }
  return 0;
}

/* Marks `channel` busy and returns its sequence number (-1: busy, -2: out
 * of memory). */
static int channel_begin(dynemb_comm *c, uint32_t channel, uint64_t *seq) {
  pthread_mutex_lock(&c->mu);
  channel_state *s = channel_find(c, channel);
  int rc = !s ? -2 : s->busy ? -1 : 0;
  if (!rc) {
    s->busy = 1;
    *seq = s->seq++;
  }
  pthread_mutex_unlock(&c->mu);
  return rc;
}

static void channel_end_locked(dynemb_comm *c, uint32_t channel) {
  for (size_t i = 0; i < c->n_ch; i++)
    if (c->ch[i].channel == channel) c->ch[i].busy = 0;
}

static void channel_end(dynemb_comm *c, uint32_t channel) {
  pthread_mutex_lock(&c->mu);
  channel_end_locked(c, channel);
  pthread_mutex_unlock(&c->mu);
}

/* Takes x off the in-flight list and frees its channel. */
static void exchange_end(dynemb_comm *c, exchange *x) {
  pthread_mutex_lock(&c->mu);
  if (x->fl_prev) x->fl_prev->fl_next = x->fl_next;
  else if (c->flight == x) c->flight = x->fl_next;
  if (x->fl_next) x->fl_next->fl_prev = x->fl_prev;
  x->fl_prev = x->fl_next = NULL;
  channel_end_locked(c, x->channel);
  pthread_mutex_unlock(&c->mu);
}

/* Records the first failed exchange (the comment of `broken`); x: the
 * exchange that failed, if one did. */
static void mark_broken(dynemb_comm *c, const char *err, const exchange *x) {
  pthread_mutex_lock(&c->mu);
  if (!c->broken) {
    c->broken = 1;
    snprintf(c->broken_err, sizeof c->broken_err, "%s", err);
    if (x) c->failed = status_entry(c, x, MPI_Wtime(), &c->failed_len);
  }
  pthread_mutex_unlock(&c->mu);
}

/* How a wait that made no progress since `*since` (0: it just began)
 * yields the core: spins for the first SPIN_S (a peer a little behind is
 * the usual case in a training step, and a sleep costs ~60 us or more to
 * wake from: measured 1.5 us per empty exchange spinning against 185 us
 * sleeping, bench/exchange_bench.c), then short sleeps, then long ones, so
 * a rank waiting for a slow one does not burn a core. */
#define SPIN_S 0.002
#define SHORT_SLEEP_S 0.05

static void backoff(double *since) {
  double now = MPI_Wtime();
  if (*since == 0) *since = now;
  double waited = now - *since;
  if (waited < SPIN_S) {
    sched_yield();
  } else {
    struct timespec ts = {0, waited < SHORT_SLEEP_S ? 20000 : 200000};
    nanosleep(&ts, NULL);
  }
}

static void exchange_free(exchange *x) {
  if (!x) return;
  /* A send a peer never took, or a receive that was still arriving (the
   * error paths), may still be read or written by MPI: its request is let
   * go and its buffer kept (a deliberate leak on a failing run: cancelling
   * a send, or a receive already matched, is not reliable across MPI
   * libraries, and a frozen peer may resume and finish the transfer into
   * the buffer). A late message that does arrive fails the peer's sequence
   * check. */
  for (int p = 0; x->sreq && x->sbuf && p < x->n; p++) {
    if (x->sending && x->sending[p]) {
      MPI_Request_free(&x->sreq[p]);
      continue;
    }
    free(x->sbuf[p]);
  }
  for (int p = 0; x->rbuf && p < x->n; p++) {
    if (x->recving && x->recving[p]) {
      MPI_Request_free(&x->rreq[p]);
      continue;
    }
    free(x->rbuf[p]);
  }
  free(x->own);
  free(x); /* (its arrays with it) */
}

/* Begins an exchange: claims the channel, sends every peer its part. */
static exchange *exchange_post(dynemb_comm *c, uint32_t channel,
                               const void *send, const size_t *send_offset,
                               const size_t *send_bytes, char *err,
                               size_t err_len) {
  pthread_mutex_lock(&c->mu);
  int broken = c->broken;
  if (broken)
    fail(err, err_len,
         "exchange channel %u not started: an earlier exchange failed (%s)",
         channel, c->broken_err);
  pthread_mutex_unlock(&c->mu);
  if (broken) return NULL;
  for (int p = 0; p < c->size; p++) /* before anything is sent */
    if (p != c->rank && send_bytes[p] > (size_t)INT32_MAX - sizeof(header)) {
      fail(err, err_len,
           "exchange channel %u: %zu bytes for rank %d exceed one MPI "
           "message (2 GiB); use smaller batches",
           channel, send_bytes[p], p);
      return NULL;
    }
  uint64_t seq = 0;
  int begun = channel_begin(c, channel, &seq);
  if (begun == -1) {
    fail(err, err_len,
         "exchange channel %u is already in use by another thread: each "
         "exchange point must run one exchange at a time",
         channel);
    return NULL;
  }
  const int n = c->size, me = c->rank;
  /* the exchange and its per-rank arrays in one allocation (an empty
   * exchange costs about a microsecond: each malloc shows) */
  const size_t un = (size_t)n;
  const size_t words = 2 * un * sizeof(MPI_Request) + 2 * un * sizeof(char *) +
                       un * sizeof(size_t);
  exchange *x = begun < 0 ? NULL
                          : calloc(1, sizeof *x + words +
                                          un * (sizeof *x->waiting + 2));
  if (x) {
    x->channel = channel;
    x->seq = seq;
    x->tag = (int)(channel % ((uint32_t)c->tag_ub + 1u));
    x->n = n;
    x->me = me;
    char *at = (char *)(x + 1); /* widest first: each array aligned */
    x->sbuf = (char **)at;
    x->rbuf = x->sbuf + un;
    x->rlen = (size_t *)(x->rbuf + un);
    x->sreq = (MPI_Request *)(x->rlen + un);
    x->rreq = x->sreq + un;
    x->waiting = (_Atomic unsigned char *)(at + words);
    x->sending = (unsigned char *)(x->waiting + un);
    x->recving = x->sending + un;
    x->own_len = send_bytes[me];
    x->own = malloc(x->own_len ? x->own_len : 1);
  }
  if (!x || !x->own) {
    fail(err, err_len, "out of memory");
    exchange_free(x);
    if (begun == 0) channel_end(c, channel);
    return NULL;
  }
  const char *src = send;
  if (x->own_len) memcpy(x->own, src + send_offset[me], x->own_len);
  for (int p = 0; p < n; p++) x->sreq[p] = x->rreq[p] = MPI_REQUEST_NULL;
  const header h = {.channel = channel, .seq = seq};
  for (int p = 0; p < n; p++) {
    if (p == me) continue;
    size_t len = sizeof h + send_bytes[p];
    x->sbuf[p] = malloc(len);
    if (!x->sbuf[p]) {
      /* earlier peers have their parts: the ranks no longer agree */
      fail(err, err_len, "out of memory");
      mark_broken(c, err, NULL);
      exchange_free(x);
      channel_end(c, channel);
      return NULL;
    }
    memcpy(x->sbuf[p], &h, sizeof h);
    if (send_bytes[p])
      memcpy(x->sbuf[p] + sizeof h, src + send_offset[p], send_bytes[p]);
    MPI_Isend(x->sbuf[p], (int)len, MPI_BYTE, p, x->tag, c->world, &x->sreq[p]);
    x->sending[p] = 1;
    atomic_store_explicit(&x->waiting[p], 1, memory_order_relaxed);
    atomic_fetch_add(&c->bytes_sent, send_bytes[p]);
  }
  x->left = x->sends_left = n - 1;
  x->begun = MPI_Wtime();
  x->next_look = x->begun + c->interval_s / 4;
  pthread_mutex_lock(&c->mu); /* seen by the status thread from now on */
  x->fl_next = c->flight;
  if (c->flight) c->flight->fl_prev = x;
  c->flight = x;
  pthread_mutex_unlock(&c->mu);
  return x;
}

/* Rank p's part has arrived whole: checks its header. 0, or -1 (x->err). */
static int part_arrived(dynemb_comm *c, exchange *x, int p) {
  x->recving[p] = 0;
  x->left--;
  size_t count = x->rlen[p];
  header got = {0};
  if (count >= sizeof got) memcpy(&got, x->rbuf[p], sizeof got);
  if (count >= sizeof got && got.channel == x->channel && got.seq == x->seq) {
    x->rlen[p] = count - sizeof got;
    return 0;
  }
  char op[256];
  status_op(c, x, op, sizeof op);
  if (count < sizeof got)
    return fail(x->err, sizeof x->err,
                "%s: rank %d sent %zu bytes, not a dynemb exchange message "
                "(another library uses the tag?)",
                op, p, count);
  return fail(x->err, sizeof x->err,
              "%s: rank %d sent exchange %llu of channel %u where this rank "
              "(%d) is at exchange %llu; the ranks run different graphs, or "
              "one skipped an exchange after an error",
              op, p, (unsigned long long)got.seq, got.channel, x->me,
              (unsigned long long)x->seq);
}

/* Takes what has arrived. 0: not finished; 1: finished; -1: failed (the
 * sentence in x->err). */
static int exchange_progress(dynemb_comm *c, exchange *x, int *progressed) {
  for (int p = 0; p < x->n; p++) {
    int done = 0;
    if (x->sending[p]) {
      MPI_Test(&x->sreq[p], &done, MPI_STATUS_IGNORE);
      if (done) {
        x->sending[p] = 0;
        x->sends_left--;
        *progressed = 1;
      }
    }
    if (x->recving[p]) {
      MPI_Test(&x->rreq[p], &done, MPI_STATUS_IGNORE);
      if (!done) continue;
      *progressed = 1;
      if (part_arrived(c, x, p)) return -1;
      continue;
    }
    if (!atomic_load_explicit(&x->waiting[p], memory_order_relaxed)) continue;
    int flag = 0;
    MPI_Message msg;
    MPI_Status st;
    MPI_Improbe(p, x->tag, c->world, &flag, &msg, &st);
    if (!flag) {
      int gone = 0;
      MPI_Iprobe(p, GOODBYE_TAG, c->world, &gone, MPI_STATUS_IGNORE);
      /* (its part, sent before the goodbye, may still be on its way on
       * another path of the network: look once more for a second) */
      double until = MPI_Wtime() + 1.0;
      while (gone && !flag && MPI_Wtime() < until)
        MPI_Improbe(p, x->tag, c->world, &flag, &msg, &st);
      if (gone && !flag) {
        char op[256];
        status_op(c, x, op, sizeof op);
        return fail(x->err, sizeof x->err,
                    "%s: rank %d ended its run without this exchange (its "
                    "input ran out first, or it runs another graph)",
                    op, p);
      }
    }
    if (!flag) continue;
    int count = 0;
    MPI_Get_count(&st, MPI_BYTE, &count);
    char *buf = malloc(count ? (size_t)count : 1);
    if (!buf) return fail(x->err, sizeof x->err, "out of memory");
    /* Not MPI_Mrecv: a large part arrives in pieces, each of which needs
     * its sender; a sender that dies or freezes halfway would hold a
     * blocking receive for ever. */
    MPI_Imrecv(buf, count, MPI_BYTE, &msg, &x->rreq[p]);
    x->rbuf[p] = buf;
    x->rlen[p] = (size_t)count;
    x->recving[p] = 1;
    atomic_store_explicit(&x->waiting[p], 0, memory_order_relaxed);
    *progressed = 1;
    MPI_Test(&x->rreq[p], &done, MPI_STATUS_IGNORE);
    if (done && part_arrived(c, x, p)) return -1;
  }
  if (!x->left && !x->sends_left) return 1;
  if (!*progressed && MPI_Wtime() >= x->next_look) return status_judge(c, x);
  return 0;
}
/* The received parts in rank order, in one malloc'd buffer. */
static int exchange_assemble(exchange *x, void **recv, size_t *recv_offset,
                             size_t *recv_bytes) {
  size_t total = 0;
  for (int p = 0; p < x->n; p++) total += p == x->me ? x->own_len : x->rlen[p];
  char *all = total ? malloc(total) : NULL;
  if (total && !all) return fail(x->err, sizeof x->err, "out of memory");
  size_t at = 0;
  for (int p = 0; p < x->n; p++) {
    size_t len = p == x->me ? x->own_len : x->rlen[p];
    const char *from = p == x->me ? x->own : x->rbuf[p] + sizeof(header);
    if (len) memcpy(all + at, from, len);
    recv_offset[p] = at;
    recv_bytes[p] = len;
    at += len;
  }
  *recv = all;
  return 0;
}

int dynemb_comm_alltoallv(dynemb_comm *c, uint32_t channel, const void *send,
                          const size_t *send_offset, const size_t *send_bytes,
                          void **recv, size_t *recv_offset, size_t *recv_bytes,
                          char *err, size_t err_len) {
  *recv = NULL;
  const double t0 = MPI_Wtime();
  exchange *x = exchange_post(c, channel, send, send_offset, send_bytes, err,
                              err_len);
  if (!x) return -1;
  int rc;
  for (;;) {
    int progressed = 0;
    rc = exchange_progress(c, x, &progressed);
    if (rc) break;
    if (progressed) x->idle = 0;
    else backoff(&x->idle);
  }
  if (rc == 1) rc = exchange_assemble(x, recv, recv_offset, recv_bytes);
  else {
    rc = -1;
    mark_broken(c, x->err, x);
  }
  if (rc) fail(err, err_len, "%s", x->err);
  exchange_end(c, x);
  exchange_free(x);
  atomic_fetch_add(&c->exchange_ns, (uint64_t)((MPI_Wtime() - t0) * 1e9));
  return rc;
}

/* The progress thread: sends the status messages, completes every pending
 * asynchronous exchange and calls its done function (from this thread).
 * Exchanges finish in any order; none waits for another. */
static void *progress_main(void *arg) {
  dynemb_comm *c = arg;
  double idle = 0;
  for (;;) {
    pthread_mutex_lock(&c->pending_mu);
    while (!c->pending && !c->stopping) {
      double wait = c->next_status - MPI_Wtime();
      if (wait <= 0) break;
      struct timespec ts;
      clock_gettime(CLOCK_MONOTONIC, &ts);
      long long ns = (long long)ts.tv_nsec + (long long)(wait * 1e9);
      ts.tv_sec += (time_t)(ns / 1000000000);
      ts.tv_nsec = (long)(ns % 1000000000);
      pthread_cond_timedwait(&c->pending_cv, &c->pending_mu, &ts);
    }
    if (!c->pending && c->stopping) {
      pthread_mutex_unlock(&c->pending_mu);
      return NULL;
    }
    exchange *list = c->pending;
    c->pending = NULL;
    pthread_mutex_unlock(&c->pending_mu);
    status_tick(c);

    int any = 0;
    exchange *keep = NULL;
    while (list) {
      exchange *x = list;
      list = x->next;
      int progressed = 0;
      int rc = exchange_progress(c, x, &progressed);
      any |= progressed;
      if (!rc) {
        x->next = keep;
        keep = x;
        continue;
      }
      void *recv = NULL;
      size_t *roff = calloc((size_t)x->n, sizeof *roff);
      size_t *rlen = calloc((size_t)x->n, sizeof *rlen);
      if (rc == 1 && (!roff || !rlen)) {
        fail(x->err, sizeof x->err, "out of memory");
        rc = -1;
      }
      if (rc == 1 && exchange_assemble(x, &recv, roff, rlen)) rc = -1;
      else if (rc != 1) mark_broken(c, x->err, x);
      /* The channel is free before done runs: done may begin the channel's
       * next exchange. */
      exchange_end(c, x);
      x->done(x->arg, rc == 1 ? 0 : -1, recv, roff, rlen,
              rc == 1 ? NULL : x->err);
      free(roff);
      free(rlen);
      exchange_free(x);
    }
    pthread_mutex_lock(&c->pending_mu);
    while (keep) { /* back in front of what arrived meanwhile */
      exchange *x = keep;
      keep = x->next;
      x->next = c->pending;
      c->pending = x;
    }
    int more = c->pending != NULL;
    pthread_mutex_unlock(&c->pending_mu);
    if (any) idle = 0;
    else if (more) backoff(&idle);
  }
}

int dynemb_comm_alltoallv_async(dynemb_comm *c, uint32_t channel,
                                const void *send, const size_t *send_offset,
                                const size_t *send_bytes, dynemb_comm_done done,
                                void *arg, char *err, size_t err_len) {
  exchange *x = exchange_post(c, channel, send, send_offset, send_bytes, err,
                              err_len);
  if (!x) return -1;
  x->done = done;
  x->arg = arg;
  pthread_mutex_lock(&c->pending_mu);
  x->next = c->pending;
  c->pending = x;
  pthread_cond_signal(&c->pending_cv);
  pthread_mutex_unlock(&c->pending_mu);
  return 0;
}
