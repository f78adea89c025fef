/*
 * test_model.c -- model-based test of the table: long random sequences of
 * train/eval lookups (half of them prepared with row tickets and read
 * through them), SGD applies (some through the tickets of an earlier prepared
 * batch, however stale by then), evictions, threshold changes, snapshots,
 * imports and clears, each checked against a small reference model written
 * here (plain arrays indexed by key id), including every stats counter.
 * The same walk runs on tables with an SSD tier under a host budget of a
 * few rows, so rows keep moving between memory and SSD: the results must
 * not change (the model knows no tiers).
 *
 * The reference uses dynemb_init_row only for initial values (tested on its
 * own in test_init.c); everything else (admission counting, stamping, the
 * eviction rule, gradient summation, SGD, import merge rules) is
 * re-implemented independently.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "dynemb.h"
#include "hash.h"
#include "init.h"

enum { K = 160, DIM = 3, MAXB = 64 };

typedef struct model {
  int has_row[K];
  float w[K][DIM];
  uint32_t last[K];
  int has_cand[K];
  uint32_t cand_count[K], cand_last[K];
  uint64_t apply_steps;
} model;

typedef struct counters {
  uint64_t lookups, hits, inserted, rejected, evicted, evicted_cands, applied,
      dropped;
} counters;

static int64_t U[K];            /* key universe */
static uint64_t rs = 0x1234567;  /* xorshift state */
static uint64_t rnd(void) { return check_xorshift(&rs); }
static uint32_t rn(uint32_t n) { return (uint32_t)(rnd() % n); }

static void make_universe(void) {
  int n = 0;
  int64_t extremes[6] = {0, -1, 1, INT64_MIN, INT64_MAX, INT64_MIN + 1};
  for (int i = 0; i < 6; i++) U[n++] = extremes[i];
  /* 40 keys whose hashes share the low bits (one long probe chain) */
  for (int64_t k = 1000; n < 46; k++)
    if ((uint32_t)dynemb_hash_key(k) < (UINT32_C(1) << 22)) U[n++] = k;
  while (n < K) U[n++] = (int64_t)rnd();
}

static int id_of(int64_t key) {
  for (int i = 0; i < K; i++)
    if (U[i] == key) return i;
  return -1;
}

static dynemb_initializer INIT = {DYNEMB_INIT_UNIFORM, -1.0f, 1.0f, 99};
static const float DEFV[DIM] = {-7, 8, 0.5f};

/* ---- the reference operations ------------------------------------------ */

static void m_lookup(model *m, counters *c, const int *ids, int n, int train,
                     uint32_t now, uint32_t thr, float *out) {
  c->lookups += (uint64_t)n;
  for (int i = 0; i < n; i++) {
    int k = ids[i];
    float *o = out + i * DIM;
    if (m->has_row[k]) {
      c->hits++;
      if (train && m->last[k] < now) m->last[k] = now;
      memcpy(o, m->w[k], sizeof m->w[k]);
      continue;
    }
    if (!train) {
      memcpy(o, DEFV, sizeof DEFV);
      continue;
    }
    if (thr > 1) {
      if (!m->has_cand[k]) {
        m->has_cand[k] = 1;
        m->cand_count[k] = 1;
        m->cand_last[k] = now;
      } else {
        m->cand_count[k]++;
        if (m->cand_last[k] < now) m->cand_last[k] = now;
      }
      if (m->cand_count[k] < thr) {
        c->rejected++;
        memcpy(o, DEFV, sizeof DEFV);
        continue;
      }
    }
    m->has_cand[k] = 0;
    m->has_row[k] = 1;
    m->last[k] = now;
    dynemb_init_row(&INIT, U[k], m->w[k], DIM);
    c->inserted++;
    memcpy(o, m->w[k], sizeof m->w[k]);
  }
}

/* `adm` (may be NULL): a prepared apply, where only keys admitted at some
 * occurrence when their batch was prepared are trained. */
static void m_apply(model *m, counters *c, const int *ids, int n,
                    const float *g, float lr, const uint8_t *adm) {
  float sum[K][DIM];
  int seen[K], allowed[K];
  memset(seen, 0, sizeof seen);
  memset(allowed, 0, sizeof allowed);
  for (int i = 0; i < n; i++) {
    int k = ids[i];
    if (!seen[k]) memcpy(sum[k], g + i * DIM, sizeof sum[k]);
    else
      for (int j = 0; j < DIM; j++) sum[k][j] += g[i * DIM + j];
    seen[k] = 1;
    allowed[k] |= !adm || adm[i];
  }
  for (int k = 0; k < K; k++) {
    if (!seen[k]) continue;
    if (!m->has_row[k] || !allowed[k]) {
      c->dropped++;
      continue;
    }
    for (int j = 0; j < DIM; j++) m->w[k][j] -= lr * sum[k][j];
    c->applied++;
  }
  m->apply_steps++;
}

static void m_evict(model *m, counters *c, int64_t now, int64_t thr) {
  if (thr <= 0) return;
  for (int k = 0; k < K; k++) {
    if (m->has_row[k] && now - (int64_t)m->last[k] > thr) {
      m->has_row[k] = 0;
      c->evicted++;
    }
    if (m->has_cand[k] && now - (int64_t)m->cand_last[k] > thr) {
      m->has_cand[k] = 0;
      c->evicted_cands++;
    }
  }
}

/* import of a model snapshot `s` into `m` (flags: REPLACE, KEEP_STEPS) */
static void m_import(model *m, const model *s, unsigned flags) {
  if (flags & DYNEMB_IMPORT_REPLACE) {
    memset(m->has_row, 0, sizeof m->has_row);
    memset(m->has_cand, 0, sizeof m->has_cand);
  }
  for (int k = 0; k < K; k++)
    if (s->has_row[k]) {
      m->has_row[k] = 1;
      memcpy(m->w[k], s->w[k], sizeof m->w[k]);
      m->last[k] = s->last[k];
      m->has_cand[k] = 0;
    }
  for (int k = 0; k < K; k++)
    if (s->has_cand[k] && !m->has_row[k]) {
      m->has_cand[k] = 1;
      m->cand_count[k] = s->cand_count[k];
      m->cand_last[k] = s->cand_last[k];
    }
  if (!(flags & DYNEMB_IMPORT_KEEP_STEPS)) m->apply_steps = s->apply_steps;
}

/* ---- comparison -------------------------------------------------------- */

static int cmp_id(const void *a, const void *b) {
  int64_t x = U[*(const int *)a], y = U[*(const int *)b];
  return x < y ? -1 : x > y;
}

static uint64_t host_budget; /* of the table under test; 0 = no SSD tier */

static int compare(dynemb_table *t, const model *m, const counters *c) {
  int bad = 0;
  dynemb_snapshot s;
  if (dynemb_table_snapshot(t, &s)) return 1;
  int ids[K], n = 0, cids[K], nc = 0;
  for (int k = 0; k < K; k++) {
    if (m->has_row[k]) ids[n++] = k;
    if (m->has_cand[k]) cids[nc++] = k;
  }
  qsort(ids, (size_t)n, sizeof *ids, cmp_id);
  qsort(cids, (size_t)nc, sizeof *cids, cmp_id);
  if (s.rows != (size_t)n || s.candidates != (size_t)nc) {
    fprintf(stderr, "rows %zu/%d candidates %zu/%d\n", s.rows, n, s.candidates, nc);
    bad++;
  } else {
    for (int i = 0; i < n; i++) {
      int k = ids[i];
      if (s.keys[i] != U[k] || s.last_access[i] != m->last[k] ||
          memcmp(s.values + i * DIM, m->w[k], sizeof m->w[k]) != 0)
        bad++;
    }
    for (int i = 0; i < nc; i++) {
      int k = cids[i];
      if (s.cand_keys[i] != U[k] || s.cand_counts[i] != m->cand_count[k] ||
          s.cand_last_access[i] != m->cand_last[k])
        bad++;
    }
  }
  if (s.apply_steps != m->apply_steps) bad++;
  dynemb_snapshot_free(&s);
  dynemb_table_stats st;
  dynemb_table_get_stats(t, &st);
  if (st.size != (uint64_t)n || st.candidates != (uint64_t)nc) bad++;
  if (st.lookups != c->lookups || st.hits != c->hits ||
      st.inserted != c->inserted || st.rejected != c->rejected ||
      st.evicted != c->evicted || st.evicted_candidates != c->evicted_cands ||
      st.applied != c->applied || st.dropped_gradients != c->dropped ||
      st.apply_steps != m->apply_steps) {
    fprintf(stderr,
            "stats: lookups %llu/%llu hits %llu/%llu inserted %llu/%llu "
            "rejected %llu/%llu evicted %llu/%llu cands %llu/%llu applied "
            "%llu/%llu dropped %llu/%llu\n",
            (unsigned long long)st.lookups, (unsigned long long)c->lookups,
            (unsigned long long)st.hits, (unsigned long long)c->hits,
            (unsigned long long)st.inserted, (unsigned long long)c->inserted,
            (unsigned long long)st.rejected, (unsigned long long)c->rejected,
            (unsigned long long)st.evicted, (unsigned long long)c->evicted,
            (unsigned long long)st.evicted_candidates,
            (unsigned long long)c->evicted_cands,
            (unsigned long long)st.applied, (unsigned long long)c->applied,
            (unsigned long long)st.dropped_gradients,
            (unsigned long long)c->dropped);
    bad++;
  }
  if (st.capacity < st.size) bad++;
  if (st.host_rows + st.ssd_rows != st.size) bad++;
  /* single-threaded, room is always made (from another shard if need be) */
  if (host_budget && st.host_rows > host_budget) {
    fprintf(stderr, "host rows %llu over budget %llu\n",
            (unsigned long long)st.host_rows, (unsigned long long)host_budget);
    bad++;
  }
  if (!host_budget && st.ssd_rows + st.ssd_reads + st.ssd_writes + st.ssd_lookups)
    bad++;
  if (st.ssd_lookups > st.hits) bad++;
  return bad;
}

/* ---- the random walk ---------------------------------------------------- */

static void run_model(int shards, uint32_t thr0, int steps, uint64_t host) {
  dynemb_table_config cfg;
  dynemb_table_config_init(&cfg);
  cfg.name = "model";
  host_budget = host;
  if (host) {
    const char *tmp = getenv("TMPDIR");
    cfg.host_vocabulary_size = host;
    cfg.ssd_vocabulary_size = K;
    cfg.ssd_data_path = tmp && tmp[0] ? tmp : "/tmp";
  }
  cfg.dim = DIM;
  cfg.init = INIT;
  cfg.default_value = DEFV;
  cfg.shards = shards;
  cfg.access_threshold = thr0;
  cfg.eviction_threshold = 6;
  cfg.optimizer.learning_rate = 0.125f;
  dynemb_table *t = NULL;
  CHECK_OK(dynemb_table_create(&cfg, &t));
  if (!t) return;
  static model m, saved;
  counters c;
  memset(&m, 0, sizeof m);
  memset(&c, 0, sizeof c);
  memset(&saved, 0, sizeof saved);
  dynemb_snapshot snap;
  memset(&snap, 0, sizeof snap);
  int have_snap = 0;
  uint32_t thr = thr0, now = 1;
  int64_t evict_thr = 6;
  int bad = 0;
  int ids[MAXB];
  int64_t keys[MAXB];
  float out[MAXB * DIM], want[MAXB * DIM], g[MAXB * DIM];
  /* the last batch prepared with row tickets */
  int p_n = 0, p_ids[MAXB];
  int64_t p_keys[MAXB];
  dynemb_ticket p_tickets[MAXB];
  uint8_t p_adm[MAXB];
  for (int step = 0; step < steps && !bad; step++) {
    uint32_t op = rn(100);
    int n = 1 + (int)rn(MAXB);
    /* hot set: keys 0..39 are frequent, the rest rare */
    for (int i = 0; i < n; i++) {
      ids[i] = rn(4) ? (int)rn(40) : (int)rn(K);
      keys[i] = U[ids[i]];
    }
    if (rn(10) == 0) now += rn(4);
    if (op < 40) { /* train lookup, or prepare with tickets + prepared read */
      int rc;
      const int via_prepare = (int)rn(2);
      if (!via_prepare) {
        rc = dynemb_lookup(t, keys, (size_t)n, DYNEMB_LOOKUP_TRAIN, now, NULL,
                           out, NULL);
      } else {
        rc = dynemb_prepare(t, keys, (size_t)n, DYNEMB_LOOKUP_TRAIN, now, NULL,
                            p_tickets);
        if (!rc)
          rc = dynemb_lookup_prepared(t, keys, p_tickets, (size_t)n, out, NULL);
        p_n = n;
        memcpy(p_ids, ids, sizeof ids);
        memcpy(p_keys, keys, sizeof keys);
        for (int i = 0; i < n; i++) p_adm[i] = p_tickets[i] != DYNEMB_NOT_ADMITTED;
      }
      m_lookup(&m, &c, ids, n, 1, now, thr, want);
      if (via_prepare) {
        /* the prepared read counts as a lookup too, each ticket as a hit */
        c.lookups += (uint64_t)n;
        for (int i = 0; i < n; i++) c.hits += p_adm[i];
      }
      if (rc || memcmp(out, want, sizeof(float) * (size_t)(n * DIM)) != 0) {
        fprintf(stderr, "step %d: train lookup differs (rc %d)\n", step, rc);
        bad++;
      }
    } else if (op < 55) { /* eval lookup, or eval prepare + prepared read */
      int rc;
      dynemb_ticket eh[MAXB];
      const int via_prepare = (int)rn(2);
      if (!via_prepare) {
        rc = dynemb_lookup(t, keys, (size_t)n, DYNEMB_LOOKUP_EVAL, now, NULL,
                           out, NULL);
      } else {
        rc = dynemb_prepare(t, keys, (size_t)n, DYNEMB_LOOKUP_EVAL, now, NULL,
                            eh);
        if (!rc) rc = dynemb_lookup_prepared(t, keys, eh, (size_t)n, out, NULL);
        c.lookups += (uint64_t)n;
        for (int i = 0; i < n; i++) c.hits += eh[i] != DYNEMB_NOT_ADMITTED;
      }
      m_lookup(&m, &c, ids, n, 0, now, thr, want);
      if (rc || memcmp(out, want, sizeof(float) * (size_t)(n * DIM)) != 0) {
        fprintf(stderr, "step %d: eval lookup differs (rc %d)\n", step, rc);
        bad++;
      }
    } else if (op < 80) { /* apply (or a prepared one, to the last prepared batch) */
      const int prepared = p_n > 0 && rn(3) == 0;
      if (prepared) n = p_n;
      for (int i = 0; i < n * DIM; i++) g[i] = (float)((int)rn(17) - 8) * 0.25f;
      float lr = rn(2) ? -1.0f : 0.5f;
      dynemb_apply_stats as;
      int rc = prepared ? dynemb_apply(
                              t, p_keys, (size_t)n, g, lr,
                              &(dynemb_apply_opts){.tickets = p_tickets}, &as)
                        : dynemb_apply(t, keys, (size_t)n, g, lr, NULL, &as);
      uint64_t applied0 = c.applied, dropped0 = c.dropped;
      m_apply(&m, &c, prepared ? p_ids : ids, n, g, lr < 0 ? 0.125f : lr,
              prepared ? p_adm : NULL);
      if (rc || as.applied != c.applied - applied0 ||
          as.dropped_unknown != c.dropped - dropped0 ||
          as.unique_keys != as.applied + as.dropped_unknown) {
        fprintf(stderr, "step %d: apply stats differ (rc %d)\n", step, rc);
        bad++;
      }
    } else if (op < 88) { /* evict, sometimes with a new threshold */
      if (rn(4) == 0) {
        evict_thr = rn(3) ? (int64_t)rn(10) : 0;
        CHECK_OK(dynemb_table_set_eviction_threshold(t, evict_thr));
      }
      size_t ev = 0;
      uint64_t e0 = c.evicted;
      CHECK_OK(dynemb_evict(t, now, DYNEMB_TABLE_THRESHOLD, &ev));
      m_evict(&m, &c, now, evict_thr);
      if (ev != c.evicted - e0) bad++;
    } else if (op < 91) { /* admission threshold change */
      thr = rn(4);
      CHECK_OK(dynemb_table_set_access_threshold(t, thr));
    } else if (op < 95) { /* snapshot kept for a later import */
      if (have_snap) dynemb_snapshot_free(&snap);
      CHECK_OK(dynemb_table_snapshot(t, &snap));
      saved = m;
      have_snap = 1;
    } else if (op < 98) { /* import the saved snapshot */
      if (!have_snap) continue;
      unsigned flags = (rn(2) ? DYNEMB_IMPORT_REPLACE : 0) |
                       (rn(2) ? DYNEMB_IMPORT_KEEP_STEPS : 0);
      CHECK_OK(dynemb_table_import(t, &snap, flags, 0, 0));
      m_import(&m, &saved, flags);
    } else if (op < 99) { /* partial import: one of 3 key shards */
      if (!have_snap) continue;
      uint32_t part = rn(3);
      model sub = saved;
      for (int k = 0; k < K; k++)
        if (dynemb_key_shard(U[k], 3) != part) sub.has_row[k] = sub.has_cand[k] = 0;
      CHECK_OK(dynemb_table_import(t, &snap, DYNEMB_IMPORT_KEEP_STEPS, part, 3));
      m_import(&m, &sub, DYNEMB_IMPORT_KEEP_STEPS);
    } else { /* clear */
      dynemb_table_clear(t);
      memset(m.has_row, 0, sizeof m.has_row);
      memset(m.has_cand, 0, sizeof m.has_cand);
    }
    if (step % 25 == 0 || op >= 91) {
      int b = compare(t, &m, &c);
      if (b) fprintf(stderr, "step %d (op %u): table differs from model\n", step, op);
      bad += b;
    }
  }
  bad += compare(t, &m, &c);
  CHECK(bad == 0);
  CHECK(c.inserted > 100 && c.applied > 100); /* the walk did real work */
  if (thr0 > 1) CHECK(c.rejected > 10);
  CHECK(c.evicted > 10);
  if (host) { /* rows did move both ways, many times */
    dynemb_table_stats st;
    dynemb_table_get_stats(t, &st);
    CHECK(st.ssd_reads > 200 && st.ssd_writes > 200);
  }
  if (have_snap) dynemb_snapshot_free(&snap);
  dynemb_table_release(t);
  dynemb_registry_clear();
}

static void test_model_one_shard(void) { run_model(1, 0, 4000, 0); }
static void test_model_4_shards_admission(void) { run_model(4, 2, 4000, 0); }
static void test_model_256_shards_admission3(void) { run_model(256, 3, 4000, 0); }
static void test_model_64_shards(void) { run_model(64, 1, 4000, 0); }
static void test_model_ssd_one_shard(void) { run_model(1, 0, 4000, 12); }
static void test_model_ssd_4_shards_admission(void) { run_model(4, 2, 4000, 16); }
static void test_model_ssd_64_shards(void) { run_model(64, 1, 4000, 24); }

int main(void) {
  make_universe();
  if (id_of(INT64_MIN) != 3) return 1;
  RUN(test_model_one_shard);
  RUN(test_model_4_shards_admission);
  RUN(test_model_256_shards_admission3);
  RUN(test_model_64_shards);
  RUN(test_model_ssd_one_shard);
  RUN(test_model_ssd_4_shards_admission);
  RUN(test_model_ssd_64_shards);
  return check_summary();
}
