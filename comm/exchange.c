/*
 * exchange.c -- dynemb_comm: all-to-all exchanges on channels over MPI
 * point-to-point messages (the design and its contract: dynemb_comm.h).
 *
 * One message per peer and exchange: a header (channel, sequence number)
 * and the payload in one buffer. Receives use matched probes
 * (MPI_Improbe/MPI_Mrecv), the thread-safe way to receive a message whose
 * size is not known in advance, so no size round trip precedes the data.
 * Waits poll with a deadline instead of blocking in MPI, which is what
 * turns a dead or stuck rank into an error naming it. Asynchronous
 * exchanges are finished by one progress thread per comm, which polls
 * every pending exchange in turn, so none waits for another.
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

#include "dynemb_comm.h"

typedef struct header {
  uint32_t channel;
  uint32_t reserved;
  uint64_t seq;
} header;

typedef struct channel_state {
  uint32_t channel;
  int busy;
  uint64_t seq; /* exchanges begun on this channel */
} channel_state;

struct dynemb_comm {
  MPI_Comm world; /* a duplicate: our tags never meet the script's */
  int rank, size, local_size;
  int tag_ub;
  int owns_mpi;
  double timeout_s;
  pthread_mutex_t mu; /* guards the channel table */
  channel_state *ch;
  size_t n_ch, cap_ch;
  _Atomic uint64_t bytes_sent;
  _Atomic uint64_t exchange_ns; /* time in blocking exchanges */
  /* Set by the first exchange that failed for a peer (deadline, wrong
   * sequence): the ranks' channels no longer agree, so every later exchange
   * fails at once with this error instead of waiting for its own deadline
   * (TensorFlow may start other exchange ops of a failed step). */
  int broken; /* guarded by mu */
  char broken_err[512];
  /* The progress thread of asynchronous exchanges (started by the first). */
  pthread_mutex_t pending_mu;
  pthread_cond_t pending_cv;
  struct exchange *pending; /* a list; the thread owns the entries */
  pthread_t progress;
  int progress_started, stopping;
};

/* The tag of the message a rank sends every peer when it leaves (channels
 * start at 1): a rank still waiting for its part then fails at once, naming
 * it, instead of at its deadline (a rank whose input ended first, say). */
#define GOODBYE_TAG 0

/* dynemb_comm_world's answer. */
static _Atomic(dynemb_comm *) the_world;

static int fail(char *err, size_t err_len, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static int fail(char *err, size_t err_len, const char *fmt, ...) {
  if (err && err_len) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err, err_len, fmt, ap);
    va_end(ap);
  }
  return -1;
}

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
  pthread_cond_init(&c->pending_cv, NULL);
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
  /* Goodbye to every peer (0-byte, eager: complete at once) before MPI's
   * finalize, which may wait for the others. */
  for (int p = 0; p < c->size; p++) {
    if (p == c->rank) continue;
    MPI_Request req;
    MPI_Isend(NULL, 0, MPI_BYTE, p, GOODBYE_TAG, c->world, &req);
    MPI_Request_free(&req);
  }
  MPI_Comm_free(&c->world);
  pthread_mutex_destroy(&c->mu);
  pthread_mutex_destroy(&c->pending_mu);
  pthread_cond_destroy(&c->pending_cv);
  int owns = c->owns_mpi;
  free(c->ch);
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

/* Marks `channel` busy and returns its sequence number (-1: busy). */
static int channel_begin(dynemb_comm *c, uint32_t channel, uint64_t *seq) {
  pthread_mutex_lock(&c->mu);
  channel_state *s = NULL;
  for (size_t i = 0; i < c->n_ch; i++)
    if (c->ch[i].channel == channel) s = &c->ch[i];
  if (!s) {
    if (c->n_ch == c->cap_ch) {
      size_t cap = c->cap_ch ? 2 * c->cap_ch : 16;
      channel_state *grown = realloc(c->ch, cap * sizeof *grown);
      if (!grown) {
        pthread_mutex_unlock(&c->mu);
        return -2;
      }
      c->ch = grown;
      c->cap_ch = cap;
    }
    s = &c->ch[c->n_ch++];
    *s = (channel_state){.channel = channel};
  }
  int rc = s->busy ? -1 : 0;
  if (!rc) {
    s->busy = 1;
    *seq = s->seq++;
  }
  pthread_mutex_unlock(&c->mu);
  return rc;
}

static void channel_end(dynemb_comm *c, uint32_t channel) {
  pthread_mutex_lock(&c->mu);
  for (size_t i = 0; i < c->n_ch; i++)
    if (c->ch[i].channel == channel) c->ch[i].busy = 0;
  pthread_mutex_unlock(&c->mu);
}

/* Records the first failed exchange (module comment of `broken`). */
static void mark_broken(dynemb_comm *c, const char *err) {
  pthread_mutex_lock(&c->mu);
  if (!c->broken) {
    c->broken = 1;
    snprintf(c->broken_err, sizeof c->broken_err, "%s", err);
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

/* "1, 3" for the ranks whose flag is set. */
static void list_ranks(const unsigned char *flags, int n, char *buf,
                       size_t len) {
  size_t used = 0;
  buf[0] = 0;
  for (int p = 0; p < n && used + 16 < len; p++)
    if (flags[p])
      used += (size_t)snprintf(buf + used, len - used, "%s%d",
                               used ? ", " : "", p);
}

/* One exchange in flight: posted by the caller's thread, completed by
 * whichever thread progresses it (the caller's own in the blocking call,
 * the progress thread for asynchronous ones). */
typedef struct exchange {
  struct exchange *next;
  uint32_t channel;
  uint64_t seq;
  int tag, n, me;
  MPI_Request *sreq;
  char **sbuf, **rbuf;
  size_t *rlen;
  unsigned char *waiting, *sending;
  int left, sends_left;
  double deadline;
  char *own; /* this rank's part for itself, copied */
  size_t own_len;
  double idle; /* since when no progress (backoff) */
  dynemb_comm_done done;
  void *arg;
  char err[512];
} exchange;

static void exchange_free(exchange *x) {
  if (!x) return;
  /* A send a peer never took (the error paths) may still be read by MPI:
   * its request is let go and its buffer kept (a deliberate leak on a
   * failing run; cancelling sends is not reliable across MPI libraries).
   * A late message that does arrive fails the peer's sequence check. */
  if (x->sreq && x->sbuf)
    for (int p = 0; p < x->n; p++) {
      if (x->sending && x->sending[p]) {
        MPI_Request_free(&x->sreq[p]);
        continue;
      }
      free(x->sbuf[p]);
    }
  if (x->rbuf)
    for (int p = 0; p < x->n; p++) free(x->rbuf[p]);
  free(x->sreq);
  free(x->sbuf);
  free(x->rbuf);
  free(x->rlen);
  free(x->waiting);
  free(x->sending);
  free(x->own);
  free(x);
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
  exchange *x = begun < 0 ? NULL : calloc(1, sizeof *x);
  if (x) {
    x->channel = channel;
    x->seq = seq;
    x->tag = (int)(channel % ((uint32_t)c->tag_ub + 1u));
    x->n = n;
    x->me = me;
    x->sreq = calloc((size_t)n, sizeof *x->sreq);
    x->sbuf = calloc((size_t)n, sizeof *x->sbuf);
    x->rbuf = calloc((size_t)n, sizeof *x->rbuf);
    x->rlen = calloc((size_t)n, sizeof *x->rlen);
    x->waiting = calloc((size_t)n, 1);
    x->sending = calloc((size_t)n, 1);
    x->own_len = send_bytes[me];
    x->own = malloc(x->own_len ? x->own_len : 1);
  }
  if (!x || !x->sreq || !x->sbuf || !x->rbuf || !x->rlen || !x->waiting ||
      !x->sending || !x->own) {
    fail(err, err_len, "out of memory");
    exchange_free(x);
    if (begun == 0) channel_end(c, channel);
    return NULL;
  }
  const char *src = send;
  if (x->own_len) memcpy(x->own, src + send_offset[me], x->own_len);
  for (int p = 0; p < n; p++) x->sreq[p] = MPI_REQUEST_NULL;
  const header h = {.channel = channel, .seq = seq};
  for (int p = 0; p < n; p++) {
    if (p == me) continue;
    size_t len = sizeof h + send_bytes[p];
    x->sbuf[p] = malloc(len);
    if (!x->sbuf[p]) {
      /* earlier peers have their parts: the ranks no longer agree */
      fail(err, err_len, "out of memory");
      mark_broken(c, err);
      exchange_free(x);
      channel_end(c, channel);
      return NULL;
    }
    memcpy(x->sbuf[p], &h, sizeof h);
    if (send_bytes[p])
      memcpy(x->sbuf[p] + sizeof h, src + send_offset[p], send_bytes[p]);
    MPI_Isend(x->sbuf[p], (int)len, MPI_BYTE, p, x->tag, c->world, &x->sreq[p]);
    x->sending[p] = x->waiting[p] = 1;
    atomic_fetch_add(&c->bytes_sent, send_bytes[p]);
  }
  x->left = x->sends_left = n - 1;
  x->deadline = MPI_Wtime() + c->timeout_s;
  return x;
}

/* Takes what has arrived. 0: not finished; 1: finished; -1: failed (the
 * sentence in x->err). */
static int exchange_progress(dynemb_comm *c, exchange *x, int *progressed) {
  for (int p = 0; p < x->n; p++) {
    if (x->sending[p]) {
      int done = 0;
      MPI_Test(&x->sreq[p], &done, MPI_STATUS_IGNORE);
      if (done) {
        x->sending[p] = 0;
        x->sends_left--;
        *progressed = 1;
      }
    }
    if (!x->waiting[p]) continue;
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
      if (gone && !flag)
        return fail(x->err, sizeof x->err,
                    "exchange channel %u (exchange %llu): rank %d ended its "
                    "run without this exchange (its input ran out first, or "
                    "it runs another graph)",
                    x->channel, (unsigned long long)x->seq, p);
    }
    if (!flag) continue;
    int count = 0;
    MPI_Get_count(&st, MPI_BYTE, &count);
    char *buf = malloc(count ? (size_t)count : 1);
    if (!buf) return fail(x->err, sizeof x->err, "out of memory");
    MPI_Mrecv(buf, count, MPI_BYTE, &msg, MPI_STATUS_IGNORE);
    x->waiting[p] = 0;
    x->left--;
    *progressed = 1;
    header got;
    if ((size_t)count < sizeof got) {
      free(buf);
      return fail(x->err, sizeof x->err,
                  "exchange channel %u: rank %d sent %d bytes, not a dynemb "
                  "exchange message (another library uses the tag?)",
                  x->channel, p, count);
    }
    memcpy(&got, buf, sizeof got);
    if (got.channel != x->channel || got.seq != x->seq) {
      free(buf);
      return fail(x->err, sizeof x->err,
                  "exchange channel %u: rank %d sent exchange %llu of channel "
                  "%u where this rank (%d) is at exchange %llu; the ranks run "
                  "different graphs, or one skipped an exchange after an error",
                  x->channel, p, (unsigned long long)got.seq, got.channel,
                  x->me, (unsigned long long)x->seq);
    }
    x->rbuf[p] = buf;
    x->rlen[p] = (size_t)count - sizeof got;
  }
  if (!x->left && !x->sends_left) return 1;
  if (!*progressed && MPI_Wtime() > x->deadline) {
    char who[256];
    list_ranks(x->left ? x->waiting : x->sending, x->n, who, sizeof who);
    return fail(x->err, sizeof x->err,
                "exchange channel %u (exchange %llu): rank(s) %s did not %s "
                "within %.0f s; that rank stopped, hangs, or runs another "
                "graph (its own error says which)",
                x->channel, (unsigned long long)x->seq, who,
                x->left ? "send their part" : "take this rank's part",
                c->timeout_s);
  }
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
    mark_broken(c, x->err);
  }
  if (rc) fail(err, err_len, "%s", x->err);
  channel_end(c, channel);
  exchange_free(x);
  atomic_fetch_add(&c->exchange_ns, (uint64_t)((MPI_Wtime() - t0) * 1e9));
  return rc;
}

/* The progress thread: completes every pending asynchronous exchange and
 * calls its done function (from this thread). Exchanges finish in any
 * order; none waits for another. */
static void *progress_main(void *arg) {
  dynemb_comm *c = arg;
  double idle = 0;
  for (;;) {
    pthread_mutex_lock(&c->pending_mu);
    while (!c->pending && !c->stopping)
      pthread_cond_wait(&c->pending_cv, &c->pending_mu);
    if (!c->pending && c->stopping) {
      pthread_mutex_unlock(&c->pending_mu);
      return NULL;
    }
    exchange *list = c->pending;
    c->pending = NULL;
    pthread_mutex_unlock(&c->pending_mu);

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
      else if (rc != 1) mark_broken(c, x->err);
      /* The channel is free before done runs: done may begin the channel's
       * next exchange. */
      channel_end(c, x->channel);
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
  pthread_mutex_lock(&c->pending_mu);
  if (!c->progress_started) {
    if (pthread_create(&c->progress, NULL, progress_main, c)) {
      pthread_mutex_unlock(&c->pending_mu);
      return fail(err, err_len, "could not start the exchange thread");
    }
    c->progress_started = 1;
  }
  pthread_mutex_unlock(&c->pending_mu);
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
