/*
 * shard_lookup.c -- dynemb_shard_lookup (shard.h): a batch of keys looked
 * up across the ranks, in two exchanges on the op's channel.
 *
 *  1. keys: each rank sends each owner its unique keys (comm/route.c) and,
 *     where a key occurs more than once, its occurrence counts.
 *  2. the owner looks up every rank's keys in rank order -- a TRAIN lookup
 *     expands them into their occurrences and prepares them as one batch,
 *     so admission counts exactly what one process would count for the
 *     ranks' batches concatenated -- and notes for each unique key how many
 *     of its leading occurrences came before its admission.
 *  3. rows: one row per unique key goes back to the rank that asked, with
 *     those counts; that rank spreads the rows over its occurrences (the
 *     ones before admission read the default value).
 *
 * A replicated table skips the second exchange: every rank looks up every
 * rank's keys alike in its own copy (so that admission counts the global
 * batch everywhere) and reads its own keys' rows.
 */
#include <stdlib.h>
#include <string.h>

#include "route.h"
#include "shard_int.h"

/* Keys part: {status, now, unique keys u, flags} then u keys and, with flag
 * COUNTS, their u occurrence counts (uint32; else each occurs once); flag
 * FOUND: the asking lookup needs to know which keys read the default (an
 * eval lookup's owner then says so too).
 * Rows part: {status, dim, u, flags} then, with flag DEFAULTS, u counts of
 * the occurrences (the first ones) that read the default value (before the
 * key's admission; uint32; else none), then u rows. */
enum { HEAD = 4 * sizeof(int64_t), COUNTS = 1, FOUND = 2, DEFAULTS = 1 };

/* What an owner received from one rank. */
typedef struct asked {
  int64_t status, now, u, flags;
  const char *keys;   /* [u] int64 (unaligned: read with memcpy) */
  const char *counts; /* [u] uint32, or NULL: ones */
  size_t first;       /* its first key among the owner's */
} asked;

/* One call: its arguments, and what its steps hand on to the next. */
typedef struct call {
  dynemb_comm *c;
  dynemb_shard_op *op;
  dynemb_table *t;
  const int64_t *keys;
  size_t n;
  int64_t now;
  float *out;
  unsigned char *found;
  dynemb_shard_error *err;
  int ranks, me;
  int64_t dim;
  size_t row_bytes;
  int64_t status; /* this rank's: PART_FAILED once it failed */
  int bad;        /* the first peer that failed, or -1 */
  dynemb_shard_route rt;
  parts pt;
  int *flags; /* [ranks]: of the part being laid out */
  asked *a;   /* [ranks]: the keys this rank owns, by asking rank */
  size_t total;      /* ... all of them */
  float *rows;       /* [total][dim]: their rows */
  uint32_t *defaults; /* [total]: their leading occurrences that read the
                         default */
  char *recv;
} call;

/* The route's group that part r carries: owner r's keys, or all keys for a
 * replicated table (its route has one group, sent to every rank). */
static int group_of(const call *x, int r) {
  return x->op->replicated ? 0 : r;
}

/* The exchanges of a call. */
static int exchanges(const call *x) { return x->op->replicated ? 1 : 2; }

static uint32_t count_of(const asked *a, size_t j) {
  uint32_t c = 1;
  if (a->counts) memcpy(&c, a->counts + j * sizeof c, sizeof c);
  return c;
}

/* mxRec's send_count (static-shape mode): the unique ids this rank sends
 * to each owner must fit it. */
static int check_send_count(call *x) {
  if (x->op->send_count <= 0) return 0;
  for (int r = 0; r < x->rt.ranks; r++) {
    size_t unique = x->rt.first[r + 1] - x->rt.first[r];
    if (unique > (size_t)x->op->send_count)
      return shard_fail(
          x->err, DYNEMB_SHARD_EINVAL,
          "dynemb sharded lookup: table '%s': this batch sends %zu unique ids "
          "to rank %d, above send_count = %lld; raise send_count to at least "
          "%zu (static-shape mode, init(use_dynamic=False))",
          x->op->table, unique, r, (long long)x->op->send_count, unique);
  }
  return 0;
}

static size_t keys_bytes(const void *p, int r) {
  const call *x = p;
  int o = group_of(x, r);
  size_t u = x->rt.first[o + 1] - x->rt.first[o];
  return u * sizeof(int64_t) +
         (x->flags[r] & COUNTS ? u * sizeof(uint32_t) : 0);
}

/* Step 1: routes the batch and sends each owner its keys; x->recv gets
 * what every rank asks of this one. -1 when the call cannot go on (the
 * remaining exchange was run with a failed status). */
static int send_keys(call *x) {
  if (!x->status && dynemb_shard_route_build(&x->rt, x->keys, x->n,
                                             x->op->replicated ? 1 : x->ranks))
    x->status = PART_FAILED, shard_fail_nomem(x->err, x->op);
  if (!x->status && check_send_count(x)) x->status = PART_FAILED;
  for (int r = 0; !x->status && r < x->ranks; r++) {
    int o = group_of(x, r);
    for (size_t g = x->rt.first[o]; g < x->rt.first[o + 1]; g++)
      if (x->rt.ucount[g] > 1) x->flags[r] = COUNTS;
  }
  for (int r = 0; x->found && r < x->ranks; r++) x->flags[r] |= FOUND;
  char *send = shard_layout(&x->pt, x->ranks, HEAD,
                            x->status ? NULL : keys_bytes, x, x->op, x->err);
  if (!send) {
    shard_exchange_failed(x->c, x->op, &x->pt, x->ranks, exchanges(x));
    return -1;
  }
  for (int r = 0; r < x->ranks; r++) {
    int o = group_of(x, r);
    size_t u = x->status ? 0 : x->rt.first[o + 1] - x->rt.first[o];
    int64_t head[4] = {x->status, x->now, (int64_t)u, x->flags[r]};
    char *part = send + x->pt.soff[r];
    memcpy(part, head, sizeof head);
    if (!u) continue;
    memcpy(part + HEAD, x->rt.ukey + x->rt.first[o], u * sizeof(int64_t));
    if (x->flags[r] & COUNTS)
      memcpy(part + HEAD + u * sizeof(int64_t), x->rt.ucount + x->rt.first[o],
             u * sizeof(uint32_t));
  }
  int rc = shard_exchange(x->c, x->op, send, &x->pt, (void **)&x->recv,
                          x->err);
  free(send);
  if (rc) {
    shard_exchange_failed(x->c, x->op, &x->pt, x->ranks, exchanges(x) - 1);
    return -1;
  }
  return 0;
}

/* The owner's lookup: every rank's unique keys looked up in rank order
 * (TRAIN: each occurrence counted), one row per unique key into x->rows
 * and, per unique key, how many of its leading occurrences read the
 * default value. Returns the engine's code. */
static int owner_lookup(call *x, int64_t now) {
  const asked *a = x->a;
  const size_t total = x->total;
  int found = 0; /* (any asking rank's lookup wants it) */
  for (int r = 0; r < x->ranks; r++) found |= (a[r].flags & FOUND) != 0;
  int64_t *ukeys = malloc((total ? total : 1) * sizeof *ukeys);
  if (!ukeys) return DYNEMB_ENOMEM;
  for (int r = 0; r < x->ranks; r++)
    if (a[r].u) memcpy(ukeys + a[r].first, a[r].keys, (size_t)a[r].u * 8);
  memset(x->defaults, 0, total * sizeof *x->defaults);
  int rc = DYNEMB_OK;
  if (x->op->mode == DYNEMB_LOOKUP_EVAL) {
    /* Reads only: every occurrence alike; with FOUND, which keys have no
     * row (rows and tickets in one pass). */
    dynemb_ticket *tk =
        found ? malloc((total ? total : 1) * sizeof *tk) : NULL;
    rc = !found || tk ? DYNEMB_OK : DYNEMB_ENOMEM;
    if (!rc && total)
      rc = dynemb_lookup(x->t, ukeys, total, DYNEMB_LOOKUP_EVAL, 0, NULL,
                         x->rows, tk);
    for (size_t g = 0; !rc && tk && g < total; g++)
      x->defaults[g] = tk[g] == DYNEMB_NOT_ADMITTED ? UINT32_MAX : 0;
    free(tk);
    free(ukeys);
    return rc;
  }
  size_t expanded = 0;
  for (int r = 0; r < x->ranks; r++)
    for (int64_t j = 0; j < a[r].u; j++) expanded += count_of(&a[r], (size_t)j);
  int64_t *each = malloc((expanded ? expanded : 1) * sizeof *each);
  dynemb_ticket *tickets = malloc((expanded ? expanded : 1) * sizeof *tickets);
  dynemb_ticket *pick = malloc((total ? total : 1) * sizeof *pick);
  if (!each || !tickets || !pick) rc = DYNEMB_ENOMEM;
  size_t e = 0;
  for (int r = 0; !rc && r < x->ranks; r++)
    for (int64_t j = 0; j < a[r].u; j++)
      for (uint32_t c = count_of(&a[r], (size_t)j); c; c--)
        each[e++] = ukeys[a[r].first + (size_t)j];
  /* (also with no keys; the engine then leaves the table as it is) */
  if (!rc)
    rc = dynemb_prepare(x->t, each, expanded, DYNEMB_LOOKUP_TRAIN, now,
                        &(dynemb_lookup_opts){.weight = x->op->weight},
                        tickets);
  /* A key's occurrences that came before its admission are the first ones
   * (once admitted within a call it stays so): count them, and read the row
   * through the first admitted occurrence's ticket. */
  e = 0;
  for (int r = 0; !rc && r < x->ranks; r++)
    for (int64_t j = 0; j < a[r].u; j++) {
      size_t g = a[r].first + (size_t)j;
      uint32_t c = count_of(&a[r], (size_t)j), m = 0;
      while (m < c && tickets[e + m] == DYNEMB_NOT_ADMITTED) m++;
      x->defaults[g] = m;
      pick[g] = m < c ? tickets[e + m] : DYNEMB_NOT_ADMITTED;
      e += c;
    }
  /* (a row gone since the prepare, evicted or cleared meanwhile, reads the
   * default for every occurrence: said so) */
  unsigned char *has = found && total ? malloc(total) : NULL;
  if (!rc && found && total && !has) rc = DYNEMB_ENOMEM;
  if (!rc && total)
    rc = dynemb_lookup_prepared(x->t, ukeys, pick, total, x->rows, has);
  for (int r = 0; !rc && has && r < x->ranks; r++)
    for (int64_t j = 0; j < a[r].u; j++) {
      size_t g = a[r].first + (size_t)j;
      if (!has[g]) x->defaults[g] = count_of(&a[r], (size_t)j);
    }
  free(has);
  free(each);
  free(tickets);
  free(pick);
  free(ukeys);
  return rc;
}

/* Step 2: this rank as owner, over what every rank asked of it. Failures
 * set x->status (the rows part then says so). */
static void serve_owner(call *x) {
  int64_t now_max = 0;
  for (int r = 0; !x->status && r < x->ranks; r++) {
    const char *part = x->recv + x->pt.roff[r];
    int64_t head[4] = {0, 0, 0, 0};
    if (x->pt.rlen[r] >= HEAD) memcpy(head, part, sizeof head);
    x->a[r] = (asked){.status = head[0], .now = head[1],
                      .u = head[2] < 0 ? 0 : head[2], .flags = head[3],
                      .keys = part + HEAD, .first = x->total};
    size_t want = HEAD + (size_t)x->a[r].u * sizeof(int64_t) +
                  (x->a[r].flags & COUNTS ? (size_t)x->a[r].u * sizeof(uint32_t)
                                          : 0);
    if (x->pt.rlen[r] != want) {
      shard_fail(x->err, DYNEMB_SHARD_EPROTOCOL,
                 "dynemb sharded lookup of table '%s': rank %d sent a part of "
                 "%zu bytes, not the %zu its head says",
                 x->op->table, r, x->pt.rlen[r], want);
      x->status = PART_FAILED;
      break;
    }
    if (x->a[r].flags & COUNTS)
      x->a[r].counts = part + HEAD + (size_t)x->a[r].u * sizeof(int64_t);
    if (x->a[r].now > now_max) now_max = x->a[r].now;
    x->total += (size_t)x->a[r].u;
  }
  const size_t total = x->total;
  x->rows = malloc((total ? total : 1) * (x->row_bytes ? x->row_bytes : 1));
  x->defaults = malloc((total ? total : 1) * sizeof *x->defaults);
  if (!x->rows || !x->defaults) {
    shard_fail_nomem(x->err, x->op);
    x->status = PART_FAILED;
  }
  if (!x->status) {
    int rc = owner_lookup(x, now_max);
    if (rc != DYNEMB_OK) {
      shard_fail_engine(x->err, rc, x->op);
      x->status = PART_FAILED;
    }
  }
}

/* The table's default row as this rank has it (a read through a "not
 * admitted" ticket; any key does), malloc'd; NULL after setting the
 * error. */
static float *default_row(call *x) {
  const dynemb_ticket none = DYNEMB_NOT_ADMITTED;
  float *def = malloc(x->row_bytes ? x->row_bytes : 1);
  int rc = def ? dynemb_lookup_prepared(x->t, x->keys, &none, 1, def, NULL)
               : DYNEMB_ENOMEM;
  if (rc != DYNEMB_OK) {
    shard_fail_engine(x->err, rc, x->op);
    free(def);
    return NULL;
  }
  return def;
}

/* A replicated table: this rank's keys read its own rows. */
static void read_own_rows(call *x) {
  const float *mine = x->rows + x->a[x->me].first * (size_t)x->dim;
  const uint32_t *m = x->defaults + x->a[x->me].first;
  int any_default = 0;
  for (size_t j = 0; j < x->rt.n_unique; j++) any_default |= m[j] > 0;
  float *def = NULL;
  if (any_default && !(def = default_row(x))) return;
  for (size_t i = 0; i < x->n; i++) {
    size_t g = x->rt.uniq_of[i];
    memcpy(x->out + i * (size_t)x->dim,
           x->rt.occ[i] < m[g] ? def : mine + g * (size_t)x->dim,
           x->row_bytes);
    if (x->found) x->found[i] = x->rt.occ[i] >= m[g];
  }
  free(def);
}

static size_t rows_bytes(const void *p, int r) {
  const call *x = p;
  if (x->status) return 0;
  size_t u = (size_t)x->a[r].u;
  return (x->flags[r] ? u * sizeof(uint32_t) : 0) + u * x->row_bytes;
}

/* Step 3, the owner's half: one row per unique key back to the rank that
 * asked, with the count of its occurrences that read the default. *recv
 * gets the rows this rank asked for. */
static int send_rows(call *x, char **recv) {
  for (int r = 0; r < x->ranks; r++) {
    x->flags[r] = 0;
    for (int64_t j = 0; !x->status && j < x->a[r].u; j++)
      if (x->defaults[x->a[r].first + (size_t)j]) x->flags[r] = DEFAULTS;
  }
  char *send = shard_layout(&x->pt, x->ranks, HEAD, rows_bytes, x, x->op,
                            x->err);
  if (!send) {
    shard_exchange_failed(x->c, x->op, &x->pt, x->ranks, 1);
    return -1;
  }
  for (int r = 0; r < x->ranks; r++) {
    size_t u = x->status ? 0 : (size_t)x->a[r].u;
    int64_t head[4] = {x->status, x->dim, (int64_t)u, x->flags[r]};
    char *part = send + x->pt.soff[r];
    memcpy(part, head, sizeof head);
    if (!u) continue;
    char *at = part + HEAD;
    if (x->flags[r] & DEFAULTS) {
      memcpy(at, x->defaults + x->a[r].first, u * sizeof(uint32_t));
      at += u * sizeof(uint32_t);
    }
    memcpy(at, x->rows + x->a[r].first * (size_t)x->dim, u * x->row_bytes);
  }
  int rc = shard_exchange(x->c, x->op, send, &x->pt, (void **)recv, x->err);
  free(send);
  return rc;
}

/* Step 3, the asking rank's half: the owners' rows spread over this
 * rank's occurrences. */
static void read_rows(call *x, const char *recv) {
  /* Each part: where its rows and default counts are. */
  const char **row_at = calloc(2 * (size_t)x->ranks, sizeof *row_at);
  const char **def_at = row_at + x->ranks;
  if (!row_at) {
    shard_fail_nomem(x->err, x->op);
    return;
  }
  int any_default = 0;
  for (int r = 0; r < x->ranks; r++) {
    int64_t head[4] = {0, -1, -1, 0};
    const char *part = recv + x->pt.roff[r];
    if (x->pt.rlen[r] >= HEAD) memcpy(head, part, sizeof head);
    size_t u = x->rt.first[r + 1] - x->rt.first[r];
    size_t want = HEAD + (head[3] & DEFAULTS ? u * sizeof(uint32_t) : 0) +
                  u * x->row_bytes;
    if (head[1] != x->dim || (size_t)head[2] != u || x->pt.rlen[r] != want) {
      shard_fail(x->err, DYNEMB_SHARD_EMISMATCH,
                 "dynemb sharded lookup: table '%s' has dim %lld on rank %d "
                 "but %lld on rank %d, or rank %d answered %lld keys for %zu; "
                 "create the table with the same configuration on every rank",
                 x->op->table, (long long)x->dim, x->me, (long long)head[1], r,
                 r, (long long)head[2], u);
      free(row_at);
      return;
    }
    def_at[r] = head[3] & DEFAULTS ? part + HEAD : NULL;
    row_at[r] = part + HEAD + (def_at[r] ? u * sizeof(uint32_t) : 0);
    any_default |= def_at[r] != NULL;
  }
  float *def = NULL;
  if (any_default && !(def = default_row(x))) {
    free(row_at);
    return;
  }
  for (size_t i = 0; i < x->n; i++) {
    size_t g = x->rt.uniq_of[i];
    int r = x->rt.uowner[g];
    size_t j = g - x->rt.first[r];
    uint32_t m = 0;
    if (def_at[r]) memcpy(&m, def_at[r] + j * sizeof m, sizeof m);
    memcpy(x->out + i * (size_t)x->dim,
           x->rt.occ[i] < m ? (const char *)def : row_at[r] + j * x->row_bytes,
           x->row_bytes);
    if (x->found) x->found[i] = x->rt.occ[i] >= m;
  }
  free(def);
  free(row_at);
}

int dynemb_shard_lookup(dynemb_comm *c, dynemb_shard_op *op, dynemb_table *t,
                        const int64_t *keys, size_t n, int64_t now,
                        float *rows, unsigned char *found,
                        dynemb_shard_error *err) {
  *err = (dynemb_shard_error){0};
  shard_label(c, op);
  call x = {.c = c, .op = op, .t = t, .keys = keys, .n = n, .now = now,
            .out = rows, .found = found, .err = err,
            .ranks = dynemb_comm_size(c), .me = dynemb_comm_rank(c),
            .dim = dynemb_table_dim(t), .bad = -1};
  x.row_bytes = (size_t)x.dim * sizeof(float);
  char *rows_recv = NULL;
  if (shard_parts_alloc(&x.pt, x.ranks))
    return shard_fail_nomem(err, op); /* (the peers time out naming it) */
  x.a = calloc((size_t)x.ranks, sizeof *x.a);
  x.flags = calloc((size_t)x.ranks, sizeof *x.flags);
  if (!x.a || !x.flags) {
    shard_fail_nomem(err, op);
    shard_exchange_failed(c, op, &x.pt, x.ranks, exchanges(&x));
    goto done;
  }
  /* A rank that fails on its own still runs every exchange of the call,
   * with a failed status. */
  if (send_keys(&x)) goto done;
  x.bad = shard_failed_peer(x.recv, &x.pt, x.ranks, x.me);
  if (x.bad >= 0) x.status = PART_FAILED;
  serve_owner(&x);
  if (op->replicated) { /* every rank looked up every rank's keys alike */
    if (err->code) goto done; /* (this rank's own failure) */
    if (x.bad >= 0) {
      shard_fail_peer(err, op, x.bad);
      goto done;
    }
    read_own_rows(&x);
    goto done;
  }
  if (send_rows(&x, &rows_recv)) goto done;
  if (err->code) goto done; /* this rank's own error is reported already */
  if (x.bad < 0) x.bad = shard_failed_peer(rows_recv, &x.pt, x.ranks, x.me);
  if (x.bad >= 0) {
    shard_fail_peer(err, op, x.bad);
    goto done;
  }
  read_rows(&x, rows_recv);
done:
  free(x.pt.soff);
  free(x.recv);
  free(rows_recv);
  free(x.rows);
  free(x.defaults);
  free(x.a);
  free(x.flags);
  dynemb_shard_route_free(&x.rt);
  return err->code;
}
