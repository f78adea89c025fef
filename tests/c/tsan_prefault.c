/*
 * tsan_prefault.c -- the slab pools' prefault thread under ThreadSanitizer:
 * two threads grow a table far past the 16 MiB at which its pools start
 * populating memory ahead in their own thread, while a third reads the
 * statistics; then the table is cleared (slabs unmapped under a running
 * thread) and grown again, and finally destroyed (the thread is joined).
 * Afterwards every key has its row with its deterministic initial value.
 * (The fork case is in plain_prefault_fork.c: TSan cannot follow a thread
 * started in a child forked from a multi-threaded process.)
 */
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "dynemb.h"

enum { DIM = 64, PER_THREAD = 60000, BATCH = 1024 };

static dynemb_table *T;
static int stop_flag, errors;
#define COUNT(x) __atomic_fetch_add(&(x), 1, __ATOMIC_RELAXED)

static int64_t key_of(int thread, int i) { return (int64_t)thread * 10000000 + i; }

static void *grow(void *arg) {
  const int id = (int)(intptr_t)arg;
  int64_t keys[BATCH];
  float *out = malloc(sizeof(float) * BATCH * DIM);
  for (int i = 0; i < PER_THREAD; i += BATCH) {
    int n = PER_THREAD - i < BATCH ? PER_THREAD - i : BATCH;
    for (int j = 0; j < n; j++) keys[j] = key_of(id, i + j);
    if (dynemb_lookup(T, keys, (size_t)n, DYNEMB_LOOKUP_TRAIN, 1, NULL, out,
                      NULL))
      COUNT(errors);
  }
  free(out);
  return NULL;
}

static void *watch(void *arg) {
  (void)arg;
  while (!__atomic_load_n(&stop_flag, __ATOMIC_RELAXED)) {
    dynemb_table_stats st;
    dynemb_table_get_stats(T, &st);
    if (st.size > 2 * PER_THREAD) COUNT(errors);
  }
  return NULL;
}

static void grow_both(void) {
  pthread_t g[2];
  for (int i = 0; i < 2; i++) pthread_create(&g[i], NULL, grow, (void *)(intptr_t)i);
  for (int i = 0; i < 2; i++) pthread_join(g[i], NULL);
}

static void test_prefault_thread_race_free(void) {
  dynemb_table_config c;
  dynemb_table_config_init(&c);
  c.name = "prefault";
  c.shards = 32; /* a 1024-key lookup read-locks every shard it touches: stay
                    under TSan's 64 locks held at once */
  c.dim = DIM;
  c.init.kind = DYNEMB_INIT_UNIFORM;
  c.init.a = -1;
  c.init.b = 1;
  CHECK_OK(dynemb_table_create(&c, &T));
  if (!T) return;
  pthread_t w;
  pthread_create(&w, NULL, watch, NULL);
  int before = check_thread_count();
  grow_both(); /* 120k rows x 256 B = ~31 MB of embeddings */
  CHECK(check_thread_count() == before + 1); /* the embedding pool's prefault thread */
  dynemb_table_clear(T);
  grow_both();
  __atomic_store_n(&stop_flag, 1, __ATOMIC_RELAXED);
  pthread_join(w, NULL);
  CHECK(errors == 0);
  CHECK(dynemb_table_size(T) == 2 * PER_THREAD);
  /* every row holds its initial value: a fresh table of the same seed
   * (never past 16 MiB, so no prefault thread) gives the same rows */
  c.name = "prefault_ref";
  dynemb_table *R = NULL;
  CHECK_OK(dynemb_table_create(&c, &R));
  int64_t keys[64];
  float a[64 * DIM], b[64 * DIM];
  for (int i = 0; i < 64; i++) keys[i] = key_of(i % 2, i * 937);
  CHECK_OK(dynemb_lookup(T, keys, 64, DYNEMB_LOOKUP_EVAL, 0, NULL, a, NULL));
  CHECK_OK(dynemb_lookup(R, keys, 64, DYNEMB_LOOKUP_TRAIN, 1, NULL, b, NULL));
  CHECK(memcmp(a, b, sizeof a) == 0);
  dynemb_table_release(R);
  dynemb_table_release(T); /* destroys it: joins the prefault thread */
  dynemb_registry_clear();
}

int main(void) {
  RUN(test_prefault_thread_race_free);
  return check_summary();
}
