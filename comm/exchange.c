/*
 * exchange.c -- dynemb_comm: all-to-all exchanges on channels over MPI
 * point-to-point messages (the design and its contract: dynemb_comm.h).
 *
 * One message per peer and exchange: a header (channel, sequence number)
 * and the payload in one buffer. Receives use matched probes
 * (MPI_Improbe/MPI_Mrecv), the thread-safe way to receive a message whose
 * size is not known in advance, so no size round trip precedes the data.
 * Waits poll with a deadline instead of blocking in MPI, which is what
 * turns a dead or stuck rank into an error naming it.
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
};

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
  *out = c;
  return 0;
}

void dynemb_comm_close(dynemb_comm *c) {
  if (!c) return;
  MPI_Comm_free(&c->world);
  pthread_mutex_destroy(&c->mu);
  int owns = c->owns_mpi;
  free(c->ch);
  free(c);
  if (owns) MPI_Finalize();
}

int dynemb_comm_rank(const dynemb_comm *c) { return c->rank; }
int dynemb_comm_size(const dynemb_comm *c) { return c->size; }
int dynemb_comm_local_size(const dynemb_comm *c) { return c->local_size; }
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

/* Short spins first (an exchange's peers are usually close behind), then
 * sleeps, so a rank waiting for a slow one does not burn a core. */
static void backoff(unsigned *idle) {
  if (++*idle < 64) {
    sched_yield();
  } else {
    struct timespec ts = {0, *idle < 1024 ? 20000 : 200000};
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

int dynemb_comm_alltoallv(dynemb_comm *c, uint32_t channel, const void *send,
                          const size_t *send_offset, const size_t *send_bytes,
                          void **recv, size_t *recv_offset, size_t *recv_bytes,
                          char *err, size_t err_len) {
  *recv = NULL;
  uint64_t seq = 0;
  int begun = channel_begin(c, channel, &seq);
  if (begun == -1)
    return fail(err, err_len,
                "exchange channel %u is already in use by another thread: "
                "each exchange point must run one exchange at a time",
                channel);
  if (begun < 0) return fail(err, err_len, "out of memory");

  const int n = c->size, me = c->rank;
  const int tag = (int)(channel % ((uint32_t)c->tag_ub + 1u));
  const char *src = send;
  int rc = -1;
  MPI_Request *sreq = calloc((size_t)n, sizeof *sreq);
  char **sbuf = calloc((size_t)n, sizeof *sbuf);
  char **rbuf = calloc((size_t)n, sizeof *rbuf);
  size_t *rlen = calloc((size_t)n, sizeof *rlen);
  unsigned char *waiting = calloc((size_t)n, 1);
  unsigned char *sending = calloc((size_t)n, 1);
  if (!sreq || !sbuf || !rbuf || !rlen || !waiting || !sending) {
    fail(err, err_len, "out of memory");
    goto out;
  }
  for (int p = 0; p < n; p++) sreq[p] = MPI_REQUEST_NULL;

  const header h = {.channel = channel, .seq = seq};
  for (int p = 0; p < n; p++) {
    if (p == me) continue;
    size_t len = sizeof h + send_bytes[p];
    if (len > (size_t)INT32_MAX) {
      fail(err, err_len,
           "exchange channel %u: %zu bytes for rank %d exceed one MPI "
           "message (2 GiB); use smaller batches",
           channel, send_bytes[p], p);
      goto out;
    }
    sbuf[p] = malloc(len);
    if (!sbuf[p]) {
      fail(err, err_len, "out of memory");
      goto out;
    }
    memcpy(sbuf[p], &h, sizeof h);
    if (send_bytes[p]) memcpy(sbuf[p] + sizeof h, src + send_offset[p], send_bytes[p]);
    MPI_Isend(sbuf[p], (int)len, MPI_BYTE, p, tag, c->world, &sreq[p]);
    sending[p] = waiting[p] = 1;
    atomic_fetch_add(&c->bytes_sent, send_bytes[p]);
  }

  const double deadline = MPI_Wtime() + c->timeout_s;
  int left = n - 1;
  int sends_left = n - 1;
  unsigned idle = 0;
  while (left > 0 || sends_left > 0) {
    int progressed = 0;
    for (int p = 0; p < n; p++) {
      if (sending[p]) {
        int done = 0;
        MPI_Test(&sreq[p], &done, MPI_STATUS_IGNORE);
        if (done) {
          sending[p] = 0;
          sends_left--;
          progressed = 1;
        }
      }
      if (!waiting[p]) continue;
      int flag = 0;
      MPI_Message msg;
      MPI_Status st;
      MPI_Improbe(p, tag, c->world, &flag, &msg, &st);
      if (!flag) continue;
      int count = 0;
      MPI_Get_count(&st, MPI_BYTE, &count);
      char *buf = malloc(count ? (size_t)count : 1);
      if (!buf) {
        fail(err, err_len, "out of memory");
        goto out;
      }
      MPI_Mrecv(buf, count, MPI_BYTE, &msg, MPI_STATUS_IGNORE);
      waiting[p] = 0;
      left--;
      progressed = 1;
      header got;
      if ((size_t)count < sizeof got) {
        free(buf);
        fail(err, err_len,
             "exchange channel %u: rank %d sent %d bytes, not a dynemb "
             "exchange message (another library uses the tag?)",
             channel, p, count);
        goto out;
      }
      memcpy(&got, buf, sizeof got);
      if (got.channel != channel || got.seq != seq) {
        free(buf);
        fail(err, err_len,
             "exchange channel %u: rank %d sent exchange %llu of channel %u "
             "where this rank (%d) is at exchange %llu; the ranks run "
             "different graphs, or one skipped an exchange after an error",
             channel, p, (unsigned long long)got.seq, got.channel, me,
             (unsigned long long)seq);
        goto out;
      }
      rbuf[p] = buf;
      rlen[p] = (size_t)count - sizeof got;
    }
    if (progressed) {
      idle = 0;
    } else if (MPI_Wtime() > deadline) {
      char who[256];
      list_ranks(left ? waiting : sending, n, who, sizeof who);
      fail(err, err_len,
           "exchange channel %u (exchange %llu): rank(s) %s did not %s "
           "within %.0f s; that rank stopped, hangs, or runs another "
           "graph (its own error says which)",
           channel, (unsigned long long)seq, who,
           left ? "send their part" : "take this rank's part", c->timeout_s);
      goto out;
    } else {
      backoff(&idle);
    }
  }

  /* Assemble: rank order, own part copied. */
  size_t total = 0;
  for (int p = 0; p < n; p++) total += p == me ? send_bytes[me] : rlen[p];
  char *all = total ? malloc(total) : NULL;
  if (total && !all) {
    fail(err, err_len, "out of memory");
    goto out;
  }
  size_t at = 0;
  for (int p = 0; p < n; p++) {
    size_t len = p == me ? send_bytes[me] : rlen[p];
    const char *from = p == me ? src + send_offset[me] : rbuf[p] + sizeof(header);
    if (len) memcpy(all + at, from, len);
    recv_offset[p] = at;
    recv_bytes[p] = len;
    at += len;
  }
  *recv = all;
  rc = 0;

out:
  /* A send a peer never took (the error paths) may still be read by MPI:
   * its request is let go and its buffer kept (a deliberate leak on a
   * failing run; cancelling sends is not reliable across MPI libraries).
   * A late message that does arrive fails the peer's sequence check. */
  if (sreq && sbuf)
    for (int p = 0; p < n; p++) {
      if (sending && sending[p]) {
        MPI_Request_free(&sreq[p]);
        continue;
      }
      free(sbuf[p]);
    }
  if (rbuf)
    for (int p = 0; p < n; p++) free(rbuf[p]);
  free(sreq);
  free(sbuf);
  free(rbuf);
  free(rlen);
  free(waiting);
  free(sending);
  channel_end(c, channel);
  return rc;
}
