/*
 * status.c -- what the ranks tell each other about their exchanges, and
 * the judgement of a wait that lasts (dynemb_comm.h, "Faults").
 *
 * Why: a deadline alone cannot tell a dead rank from a busy one, nor a
 * healthy rank that waits for a dead one from the dead one itself, nor two
 * ranks that wait in different exchanges (which never end) from two that
 * are merely slow. So every rank sends each peer, every `interval_s` and
 * from the progress thread (a rank busy in TensorFlow or in a save still
 * does), a small status message on a communicator of its own: the
 * exchanges it is in, since when, and which ranks' parts it has not seen
 * (those ranks have not begun that exchange: a rank sends every part as it
 * begins). A wait that makes no progress looks at the latest status of
 * every peer:
 *  - a rank it waits for that sent nothing for timeout_s is silent: the
 *    error names exactly those, and says what the others are doing;
 *  - a cycle of "waits for a rank that has not begun this exchange" through
 *    this rank, each link older than GRACE, is a deadlock (no rank of the
 *    cycle can move): the ranks run different exchanges, and every member
 *    fails at once naming the operations of both sides. Ranks that run the
 *    same graph never form one for long: the exchanges of one chain run in
 *    one order on every rank (docs/distributed.md);
 *  - a peer whose exchange failed (it says so) will begin nothing more;
 *  - ranks that are alive but stay away are waited for ABSENT_FACTOR x
 *    timeout_s: busy is no fault, but a wait must end.
 *
 * The message, native byte order (every rank runs this build), at most
 * STATUS_MAX bytes so that MPI sends it eagerly:
 *   head  u32 magic, u16 entries, u16 flags (TRUNCATED, BROKEN),
 *         u16 reason bytes, u16 0, u32 0, u64 number (counts up);
 *   the reason of a BROKEN rank (its first failed exchange's error);
 *   per entry: u32 channel, u16 label bytes, u16 exchanges per run,
 *         u32 age in ms, u32 0, u64 sequence number; then one bit per rank
 *         (set: that rank's part not seen), then the label.
 * Entries that do not fit are left out (flag TRUNCATED: thousands of ranks,
 * or hundreds of exchanges at once); a cycle through them is then ended by
 * the bound on absent ranks instead.
 */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "comm_internal.h"

#define STATUS_TAG 1
#define STATUS_MAGIC 0x534e5944u /* "DYNS" */
#define STATUS_MAX 3072
#define HEAD_BYTES 24
#define ENTRY_BYTES 24
#define LABEL_MAX 96
#define REASON_MAX 240
#define F_TRUNCATED 1
#define F_BROKEN 2
/* A status younger than FRESH intervals: its sender is alive. A wait-for
 * link older than GRACE intervals is stuck. */
#define FRESH 3.0
#define GRACE 2.0
#define ABSENT_FACTOR 5.0

#define fail dynemb_comm_fail

typedef struct head {
  uint32_t magic;
  uint16_t entries, flags, reason_len, zero16;
  uint32_t zero32;
  uint64_t number;
} head;

typedef struct entry {
  uint32_t channel;
  uint16_t label_len, per_run;
  uint32_t age_ms, zero;
  uint64_t seq;
} entry;

_Static_assert(sizeof(head) == HEAD_BYTES, "status head layout");
_Static_assert(sizeof(entry) == ENTRY_BYTES, "status entry layout");

static size_t bitmap_bytes(const dynemb_comm *c) {
  return ((size_t)c->size + 7) / 8;
}

int status_init(dynemb_comm *c) {
  /* Often enough that silence and deadlocks are seen well within the
   * timeout, rarely enough to cost nothing (bench/exchange_bench.c). */
  c->interval_s = c->timeout_s / 8 < 1.0 ? c->timeout_s / 8 : 1.0;
  pthread_mutex_init(&c->status_mu, NULL);
  pthread_mutex_init(&c->drain_mu, NULL);
  c->peers = calloc((size_t)c->size, sizeof *c->peers);
  if (!c->peers) return -1;
  double now = MPI_Wtime();
  for (int p = 0; p < c->size; p++) {
    c->peers[p].arrived = now;
    c->peers[p].req = c->peers[p].sreq = MPI_REQUEST_NULL;
  }
  c->next_status = now;
  return 0;
}

void status_fini(dynemb_comm *c) {
  for (int p = 0; c->peers && p < c->size; p++) {
    peer_status *s = &c->peers[p];
    /* Requests still open are let go with their buffers (a deliberate leak,
     * as for the exchange's sends: MPI may still touch them). */
    if (s->sreq != MPI_REQUEST_NULL) MPI_Request_free(&s->sreq);
    else free(s->sbuf);
    if (s->req != MPI_REQUEST_NULL) MPI_Request_free(&s->req);
    else free(s->rbuf);
    free(s->msg);
  }
  free(c->peers);
  c->peers = NULL;
  pthread_mutex_destroy(&c->status_mu);
  pthread_mutex_destroy(&c->drain_mu);
}

const char *status_label(dynemb_comm *c, uint32_t channel, char *buf,
                         size_t len, int *per_run) {
  *per_run = 1;
  for (size_t i = 0; i < c->n_ch; i++)
    if (c->ch[i].channel == channel && c->ch[i].label) {
      *per_run = c->ch[i].per_run;
      snprintf(buf, len, "%s", c->ch[i].label);
      return buf;
    }
  (void)channel;
  if (len) buf[0] = 0;
  return buf;
}

unsigned char *status_entry(dynemb_comm *c, const exchange *x, double now,
                            size_t *len) {
  char label[LABEL_MAX + 1];
  int per_run = 1;
  status_label(c, x->channel, label, sizeof label, &per_run);
  size_t bm = bitmap_bytes(c), ll = strlen(label);
  double age = (now - x->begun) * 1e3;
  entry e = {.channel = x->channel,
             .label_len = (uint16_t)ll,
             .per_run = (uint16_t)(per_run > 65535 ? 65535 : per_run),
             .age_ms = age > 4e9 ? 4000000000u : age > 0 ? (uint32_t)age : 0,
             .seq = x->seq};
  *len = sizeof e + bm + ll;
  unsigned char *out = calloc(1, *len);
  if (!out) return NULL;
  memcpy(out, &e, sizeof e);
  for (int p = 0; p < x->n; p++)
    if (atomic_load_explicit(&x->waiting[p], memory_order_relaxed))
      out[sizeof e + (size_t)p / 8] |= (unsigned char)(1u << (p % 8));
  memcpy(out + sizeof e + bm, label, ll);
  return out;
}

/* This rank's status, malloc'd (NULL: out of memory). */
static unsigned char *status_build(dynemb_comm *c, size_t *len) {
  unsigned char *m = malloc(STATUS_MAX);
  if (!m) return NULL;
  head h = {.magic = STATUS_MAGIC, .number = ++c->status_number};
  size_t at = sizeof h;
  double now = MPI_Wtime();
  pthread_mutex_lock(&c->mu);
  if (c->broken) {
    h.flags |= F_BROKEN;
    size_t r = strlen(c->broken_err);
    h.reason_len = (uint16_t)(r > REASON_MAX ? REASON_MAX : r);
    memcpy(m + at, c->broken_err, h.reason_len);
    at += h.reason_len;
    if (c->failed && at + c->failed_len <= STATUS_MAX) {
      memcpy(m + at, c->failed, c->failed_len);
      at += c->failed_len;
      h.entries = 1;
    }
  } else {
    for (exchange *x = c->flight; x; x = x->fl_next) {
      size_t n = 0;
      unsigned char *e = status_entry(c, x, now, &n);
      if (!e || at + n > STATUS_MAX || h.entries == UINT16_MAX) {
        free(e);
        h.flags |= F_TRUNCATED;
        break;
      }
      memcpy(m + at, e, n);
      free(e);
      at += n;
      h.entries++;
    }
  }
  pthread_mutex_unlock(&c->mu);
  memcpy(m, &h, sizeof h);
  *len = at;
  return m;
}

/* A status that arrived from p (taken over), if newer than the one kept. */
static void status_accept(dynemb_comm *c, int p, unsigned char *m, size_t len,
                          double now) {
  head h;
  if (len < sizeof h) {
    free(m);
    return;
  }
  memcpy(&h, m, sizeof h);
  if (h.magic != STATUS_MAGIC) {
    free(m);
    return;
  }
  pthread_mutex_lock(&c->status_mu);
  peer_status *s = &c->peers[p];
  if (!s->msg || h.number > s->number) {
    free(s->msg);
    s->msg = m;
    s->len = len;
    s->number = h.number;
    s->arrived = now;
    m = NULL;
  }
  pthread_mutex_unlock(&c->status_mu);
  free(m);
}

/* Takes every status that has arrived (one thread at a time; another
 * thread draining meanwhile does it for this one). */
static void status_drain(dynemb_comm *c) {
  if (pthread_mutex_trylock(&c->drain_mu)) return;
  for (int p = 0; p < c->size; p++) {
    if (p == c->rank) continue;
    peer_status *s = &c->peers[p];
    for (;;) {
      int done = 0;
      if (s->req == MPI_REQUEST_NULL) {
        int flag = 0;
        MPI_Message msg;
        MPI_Status st;
        MPI_Improbe(p, STATUS_TAG, c->status_world, &flag, &msg, &st);
        if (!flag) break;
        int count = 0;
        MPI_Get_count(&st, MPI_BYTE, &count);
        s->rbuf = malloc(count > 0 ? (size_t)count : 1);
        if (!s->rbuf) { /* taken and dropped: the next one will do */
          char scratch[1];
          MPI_Mrecv(scratch, 0, MPI_BYTE, &msg, MPI_STATUS_IGNORE);
          break;
        }
        s->rcount = (size_t)count;
        MPI_Imrecv(s->rbuf, count, MPI_BYTE, &msg, &s->req);
      }
      MPI_Test(&s->req, &done, MPI_STATUS_IGNORE);
      if (!done) break; /* (its sender froze halfway: try again later) */
      status_accept(c, p, s->rbuf, s->rcount, MPI_Wtime());
      s->rbuf = NULL;
    }
  }
  pthread_mutex_unlock(&c->drain_mu);
}

void status_tick(dynemb_comm *c) {
  double now = MPI_Wtime();
  if (now < c->next_status) return;
  c->next_status = now + c->interval_s;
  status_drain(c);
  size_t len = 0;
  unsigned char *m = status_build(c, &len);
  if (!m) return;
  for (int p = 0; p < c->size; p++) {
    if (p == c->rank) continue;
    peer_status *s = &c->peers[p];
    if (s->sreq != MPI_REQUEST_NULL) {
      int done = 0;
      MPI_Test(&s->sreq, &done, MPI_STATUS_IGNORE);
      if (!done) continue; /* the peer takes nothing: no pile of them */
    }
    free(s->sbuf);
    s->sbuf = malloc(len);
    if (!s->sbuf) continue;
    memcpy(s->sbuf, m, len);
    MPI_Isend(s->sbuf, (int)len, MPI_BYTE, p, STATUS_TAG, c->status_world,
              &s->sreq);
  }
  free(m);
}

/* ---- reading a peer's status (the caller holds status_mu) ---- */

typedef struct view {
  const head *h; /* copied out below */
  head hd;
  const unsigned char *reason, *entries, *end;
} view;

static int view_of(const dynemb_comm *c, int p, view *v) {
  const peer_status *s = &c->peers[p];
  if (!s->msg) return -1;
  memcpy(&v->hd, s->msg, sizeof v->hd);
  v->h = &v->hd;
  v->reason = s->msg + sizeof(head);
  v->entries = v->reason + v->hd.reason_len;
  v->end = s->msg + s->len;
  return v->entries <= v->end ? 0 : -1;
}

/* The entry at *at (advanced past it), its bitmap and label; -1 at the
 * end or on a damaged message. */
static int next_entry(const dynemb_comm *c, const view *v,
                      const unsigned char **at, entry *e,
                      const unsigned char **bits, const char **label) {
  size_t bm = bitmap_bytes(c);
  if (*at + sizeof *e > v->end) return -1;
  memcpy(e, *at, sizeof *e);
  if (*at + sizeof *e + bm + e->label_len > v->end) return -1;
  *bits = *at + sizeof *e;
  *label = (const char *)*bits + bm;
  *at += sizeof *e + bm + e->label_len;
  return 0;
}

static int bit(const unsigned char *bits, int p) {
  return bits[p / 8] >> (p % 8) & 1;
}

/* "lookup of table 't' (train), run 3 (exchange 7 of channel 17)" */
static void op_text(char *buf, size_t len, const char *label, int label_len,
                    int per_run, uint32_t channel, uint64_t seq) {
  if (label_len > 0)
    snprintf(buf, len, "%.*s, run %llu (exchange %llu of channel %u)",
             label_len, label, (unsigned long long)(seq / (uint64_t)per_run),
             (unsigned long long)seq, channel);
  else
    snprintf(buf, len, "exchange %llu of channel %u", (unsigned long long)seq,
             channel);
}

static size_t add(char *buf, size_t len, size_t used, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static size_t add(char *buf, size_t len, size_t used, const char *fmt, ...) {
  if (used >= len) return used;
  va_list ap;
  va_start(ap, fmt);
  int n = vsnprintf(buf + used, len - used, fmt, ap);
  va_end(ap);
  return n < 0 ? used : used + (size_t)n < len ? used + (size_t)n : len;
}

/* What rank q is doing, as its latest status says. */
static size_t describe(dynemb_comm *c, int q, double now, char *buf,
                       size_t len, size_t used) {
  double quiet = now - c->peers[q].arrived;
  view v;
  if (quiet >= FRESH * c->interval_s || view_of(c, q, &v))
    return add(buf, len, used, "rank %d: no sign of life for %.1f s", q,
               quiet);
  if (v.h->flags & F_BROKEN)
    return add(buf, len, used, "rank %d: alive, its own exchange failed (%.*s)",
               q, (int)v.h->reason_len, (const char *)v.reason);
  /* its longest wait for a rank, else its oldest exchange */
  const unsigned char *at = v.entries, *bits = NULL, *best_bits = NULL;
  const char *label = NULL, *best_label = NULL;
  entry e, best = {0};
  int best_any = 0;
  for (int i = 0; i < v.h->entries && !next_entry(c, &v, &at, &e, &bits, &label);
       i++) {
    int any = 0;
    for (int p = 0; p < c->size; p++) any |= bit(bits, p);
    if (!best_bits || any > best_any ||
        (any == best_any && e.age_ms > best.age_ms)) {
      best = e;
      best_bits = bits;
      best_label = label;
      best_any = any;
    }
  }
  if (!best_bits) return add(buf, len, used, "rank %d: alive, in no exchange", q);
  char op[256];
  op_text(op, sizeof op, best_label, best.label_len,
          best.per_run ? best.per_run : 1, best.channel, best.seq);
  if (!best_any)
    return add(buf, len, used,
               "rank %d: alive, in %s, whose every part is on its way", q, op);
  used = add(buf, len, used, "rank %d: alive, waiting for rank", q);
  int k = 0;
  for (int p = 0; p < c->size; p++)
    if (bit(best_bits, p)) used = add(buf, len, used, "%s %d", k++ ? "," : "", p);
  return add(buf, len, used, " in %s", op);
}

/* The other ranks, each described, after "; " (at most a few dozen). */
static size_t describe_others(dynemb_comm *c, const unsigned char *skip,
                              double now, char *buf, size_t len, size_t used) {
  int k = 0;
  for (int q = 0; q < c->size && k < 32; q++) {
    if (q == c->rank || skip[q]) continue;
    used = add(buf, len, used, "; ");
    used = describe(c, q, now, buf, len, used);
    k++;
  }
  return used;
}

/* The exchanges begun on `channel` by this rank (the caller holds mu). */
static uint64_t begun_on(const dynemb_comm *c, uint32_t channel) {
  for (size_t i = 0; i < c->n_ch; i++)
    if (c->ch[i].channel == channel) return c->ch[i].seq;
  return 0;
}

/* A cycle me -> ... -> me of stuck waits (the module comment): the path in
 * `from` (from[q]: who waits for q on the path, -1: none), its last member
 * in *last. The caller holds status_mu and mu. */
static int find_cycle(dynemb_comm *c, const exchange *x, double now,
                      int *from, int *queue, int *last) {
  const double grace = GRACE * c->interval_s;
  int n = c->size, head_i = 0, tail = 0;
  for (int q = 0; q < n; q++) from[q] = -1;
  const double mine = now - x->begun;
  for (int p = 0; p < n; p++) {
    if (p == x->me || !atomic_load_explicit(&x->waiting[p], memory_order_relaxed))
      continue;
    view v;
    int broken = !view_of(c, p, &v) && (v.h->flags & F_BROKEN);
    if (mine < grace && !broken) continue;
    from[p] = x->me;
    queue[tail++] = p;
  }
  while (head_i < tail) {
    int q = queue[head_i++];
    view v;
    if (view_of(c, q, &v)) continue;
    double quiet = now - c->peers[q].arrived;
    int broken = (v.h->flags & F_BROKEN) != 0;
    if (!broken && quiet >= FRESH * c->interval_s) continue; /* silence */
    const unsigned char *at = v.entries, *bits;
    const char *label;
    entry e;
    for (int i = 0; i < v.h->entries && !next_entry(c, &v, &at, &e, &bits, &label);
         i++) {
      if (!broken && e.age_ms * 1e-3 + quiet < grace) continue;
      if (bit(bits, x->me) && begun_on(c, e.channel) <= e.seq) {
        *last = q;
        return 1;
      }
      for (int t = 0; t < n; t++)
        if (t != x->me && bit(bits, t) && from[t] < 0) {
          from[t] = q;
          queue[tail++] = t;
        }
    }
  }
  return 0;
}

/* The op rank q waits in for rank t (its status's entry), into buf. */
static void op_of(dynemb_comm *c, int q, int t, char *buf, size_t len) {
  view v;
  snprintf(buf, len, "an exchange");
  if (view_of(c, q, &v)) return;
  const unsigned char *at = v.entries, *bits;
  const char *label;
  entry e;
  for (int i = 0; i < v.h->entries && !next_entry(c, &v, &at, &e, &bits, &label);
       i++)
    if (bit(bits, t)) {
      op_text(buf, len, label, e.label_len, e.per_run ? e.per_run : 1,
              e.channel, e.seq);
      return;
    }
}

void status_op(dynemb_comm *c, const exchange *x, char *buf, size_t len) {
  char label[LABEL_MAX + 1];
  int per_run = 1;
  pthread_mutex_lock(&c->mu);
  status_label(c, x->channel, label, sizeof label, &per_run);
  pthread_mutex_unlock(&c->mu);
  op_text(buf, len, label, (int)strlen(label), per_run, x->channel, x->seq);
}

int status_judge(dynemb_comm *c, exchange *x) {
  double now = MPI_Wtime();
  x->next_look = now + c->interval_s / 4;
  status_drain(c);
  now = MPI_Wtime();
  const int n = c->size;
  char mine[256];
  pthread_mutex_lock(&c->mu);
  int broken = c->broken;
  if (broken)
    fail(x->err, sizeof x->err, "an earlier exchange failed (%s)",
         c->broken_err);
  pthread_mutex_unlock(&c->mu);
  if (broken) return -1;
  status_op(c, x, mine, sizeof mine);
  int *from = malloc(2 * (size_t)n * sizeof *from);
  unsigned char *silent = calloc((size_t)n, 1);
  if (!from || !silent) {
    free(from);
    free(silent);
    return 0; /* (looked at again soon) */
  }
  int rc = 0;
  size_t used = 0;
  char *err = x->err;
  const size_t len = sizeof x->err;
  pthread_mutex_lock(&c->status_mu);
  /* Silence: the ranks it waits for, whatever stage their part is in. */
  int n_silent = 0;
  double quietest = 0;
  for (int p = 0; p < n; p++) {
    int waited = atomic_load_explicit(&x->waiting[p], memory_order_relaxed) ||
                 x->recving[p] || x->sending[p];
    double quiet = now - c->peers[p].arrived;
    if (p != x->me && waited && quiet >= c->timeout_s) {
      silent[p] = 1;
      n_silent++;
      if (quiet > quietest) quietest = quiet;
    }
  }
  int last = -1;
  if (n_silent) {
    used = add(err, len, used, "%s: rank", mine);
    for (int p = 0, k = 0; p < n; p++)
      if (silent[p]) used = add(err, len, used, "%s %d", k++ ? "," : "", p);
    used = add(err, len, used,
               " sent nothing for %.1f s (the exchange timeout is %g s): "
               "stopped, frozen or unreachable, not busy (a busy rank still "
               "reports)",
               quietest, c->timeout_s);
    used = describe_others(c, silent, now, err, len, used);
    rc = -1;
  } else {
    pthread_mutex_lock(&c->mu);
    int cycle = find_cycle(c, x, now, from, from + n, &last);
    pthread_mutex_unlock(&c->mu);
    if (cycle) {
      /* the path back from `last`: me -> ... -> last -> me */
      int *path = from + n, k = 0;
      for (int q = last; q != x->me && k < n; q = from[q]) path[k++] = q;
      used = add(err, len, used,
                 "the ranks wait in different exchanges, each for one that "
                 "another has not begun: this rank (%d) is in %s, waiting for "
                 "rank %d",
                 x->me, mine, path[k - 1]);
      for (int i = k - 1; i >= 0; i--) {
        char op[256];
        int next = i ? path[i - 1] : x->me;
        op_of(c, path[i], next, op, sizeof op);
        used = add(err, len, used, "; rank %d is in %s, waiting for %s%d%s",
                   path[i], op, next == x->me ? "this rank (" : "rank ", next,
                   next == x->me ? ")" : "");
      }
      used = add(err, len, used,
                 ". No rank of the cycle can go on: one rank's input ran out "
                 "before the others' (it went on to evaluate, say), or the "
                 "ranks run different graphs or steps");
      rc = -1;
    }
  }
  if (!rc) { /* a peer whose exchange failed will begin nothing more */
    for (int p = 0; p < n && !rc; p++) {
      view v;
      if (p == x->me ||
          !atomic_load_explicit(&x->waiting[p], memory_order_relaxed) ||
          view_of(c, p, &v) || !(v.h->flags & F_BROKEN))
        continue;
      used = add(err, len, used,
                 "%s: rank %d had an exchange fail and begins no more "
                 "(its error: %.*s)",
                 mine, p, (int)v.h->reason_len, (const char *)v.reason);
      rc = -1;
    }
  }
  if (!rc && now - x->begun >= ABSENT_FACTOR * c->timeout_s) {
    used = add(err, len, used,
               "%s: waited %.0f s (5 x the exchange timeout) for rank", mine,
               now - x->begun);
    for (int p = 0; p < n; p++) silent[p] = 1;
    for (int p = 0, k = 0; p < n; p++)
      if (p != x->me &&
          (atomic_load_explicit(&x->waiting[p], memory_order_relaxed) ||
           x->recving[p] || x->sending[p])) {
        used = add(err, len, used, "%s %d", k++ ? "," : "", p);
        silent[p] = 0;
      }
    used = add(err, len, used,
               ", alive but not joining (it runs other code, or its input "
               "stalls)");
    used = describe_others(c, silent, now, err, len, used);
    rc = -1;
  }
  pthread_mutex_unlock(&c->status_mu);
  (void)used;
  free(from);
  free(silent);
  return rc;
}
