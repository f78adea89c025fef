/*
 * plain_prefault_fork.c -- fork() while a table's prefault thread runs
 * (built without sanitizers: ASan builds take slabs from malloc and never
 * start the thread, and TSan cannot follow threads started in a child of a
 * multi-threaded process). The child, which has no copy of the parent's
 * thread, grows its copy of the table (starting a thread of its own) and
 * destroys it (joining that one); the parent's table and thread are
 * unaffected.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "check.h"
#include "dynemb.h"

enum { DIM = 64, ROWS = 100000, BATCH = 1024 };

/* Train-mode lookups of keys base .. base + ROWS - 1: ~25 MB of rows. */
static int grow(dynemb_table *t, int64_t base) {
  int64_t keys[BATCH];
  float *out = malloc(sizeof(float) * BATCH * DIM);
  int ok = out != NULL;
  for (int i = 0; ok && i < ROWS; i += BATCH) {
    int n = ROWS - i < BATCH ? ROWS - i : BATCH;
    for (int j = 0; j < n; j++) keys[j] = base + i + j;
    ok = dynemb_lookup(t, keys, (size_t)n, DYNEMB_LOOKUP_TRAIN, 1, NULL, out,
                       NULL) == DYNEMB_OK;
  }
  free(out);
  return ok;
}

static void test_fork_with_prefault_thread(void) {
  dynemb_table_config c;
  dynemb_table_config_init(&c);
  c.name = "fork";
  c.dim = DIM;
  dynemb_table *t = NULL;
  CHECK_OK(dynemb_table_create(&c, &t));
  if (!t) return;
  int before = check_thread_count();
  CHECK(grow(t, 0));
  CHECK(check_thread_count() == before + 1);
  fflush(NULL);
  pid_t pid = fork();
  if (pid == 0) {
    int ok = check_thread_count() == 1 && grow(t, 1000000000);
    ok &= check_thread_count() == 2 && dynemb_table_size(t) == 2 * ROWS;
    dynemb_table_release(t);
    dynemb_registry_clear(); /* the last reference: destroys the table */
    ok &= check_thread_count() == 1;
    _exit(ok ? 0 : 1);
  }
  int status = -1;
  CHECK(pid > 0 && waitpid(pid, &status, 0) == pid);
  CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  CHECK(grow(t, 2000000000) && dynemb_table_size(t) == 2 * ROWS);
  dynemb_table_release(t);
  dynemb_registry_clear();
  CHECK(check_thread_count() == before);
}

int main(void) {
  RUN(test_fork_with_prefault_thread);
  return check_summary();
}
