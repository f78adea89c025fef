/*
 * check.h -- the tiny test harness shared by the C tests.
 *
 * A test is a `static void name(void)`; CHECK* macros record failures
 * without stopping the test; RUN(name) prints "PASS name" or "FAIL name"
 * (tests/run_all.sh counts those lines) and main returns check_summary().
 *
 * Test names on the command line run only those tests:
 *   build/asan/test_table test_admission test_apply_sgd
 * (`make check T=test_table F=test_admission`). A name that no RUN in the
 * program has is a failure, so a typo cannot pass as an empty run.
 */
#ifndef DYNEMB_CHECK_H
#define DYNEMB_CHECK_H

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int check_failed_in_test;
static int check_passed_total, check_failed_total;

/* The test names of the command line. glibc passes main's argc/argv to
 * constructors too, which lets the tests keep `int main(void)`. */
#define CHECK_MAX_NAMES 64
static int check_names_n;
static const char *check_names[CHECK_MAX_NAMES];
static int check_name_ran[CHECK_MAX_NAMES];

__attribute__((constructor)) static void check_read_names(int argc,
                                                          char **argv) {
  for (int i = 1; i < argc; i++) {
    if (check_names_n == CHECK_MAX_NAMES) {
      fprintf(stderr, "check.h: more than %d test names\n", CHECK_MAX_NAMES);
      exit(2);
    }
    check_names[check_names_n++] = argv[i];
  }
}

/* Whether the test `name` runs: every test when no names were given. */
static inline int check_selected(const char *name) {
  int selected = !check_names_n;
  for (int i = 0; i < check_names_n; i++)
    if (!strcmp(check_names[i], name)) selected = check_name_ran[i] = 1;
  return selected;
}

#define CHECK(cond)                                                        \
  do {                                                                     \
    if (!(cond)) {                                                         \
      fprintf(stderr, "%s:%d: CHECK failed: %s\n", __FILE__, __LINE__,     \
              #cond);                                                      \
      check_failed_in_test++;                                              \
    }                                                                      \
  } while (0)

/* Checks that a dynemb call returned `want`; prints the engine message. */
#define CHECK_RC(call, want)                                               \
  do {                                                                     \
    int check_rc_ = (call);                                                \
    if (check_rc_ != (want)) {                                             \
      fprintf(stderr, "%s:%d: %s returned %d, want %d (%s)\n", __FILE__,   \
              __LINE__, #call, check_rc_, (int)(want),                     \
              dynemb_last_error());                                        \
      check_failed_in_test++;                                              \
    }                                                                      \
  } while (0)

#define CHECK_OK(call) CHECK_RC(call, DYNEMB_OK)

/* |a - b| <= atol + rtol * |b| */
#define CHECK_NEAR(a, b, rtol, atol)                                       \
  do {                                                                     \
    double check_a_ = (double)(a), check_b_ = (double)(b);                 \
    if (!(fabs(check_a_ - check_b_) <= (atol) + (rtol)*fabs(check_b_))) { \
      fprintf(stderr, "%s:%d: %s = %.9g, want %s = %.9g\n", __FILE__,      \
              __LINE__, #a, check_a_, #b, check_b_);                       \
      check_failed_in_test++;                                              \
    }                                                                      \
  } while (0)

#define RUN(test)                                                          \
  do {                                                                     \
    if (!check_selected(#test)) break;                                     \
    check_failed_in_test = 0;                                              \
    test();                                                                \
    if (check_failed_in_test) {                                            \
      check_failed_total++;                                                \
      printf("FAIL %s\n", #test);                                          \
    } else {                                                               \
      check_passed_total++;                                                \
      printf("PASS %s\n", #test);                                          \
    }                                                                      \
    fflush(stdout);                                                        \
  } while (0)

static inline int check_summary(void) {
  for (int i = 0; i < check_names_n; i++)
    if (!check_name_ran[i]) {
      check_failed_total++;
      printf("FAIL %s (this program has no such test)\n", check_names[i]);
    }
  printf("%d passed, %d failed\n", check_passed_total, check_failed_total);
  return check_failed_total ? 1 : 0;
}

/* One xorshift64 step of *state (tests' reproducible random streams; each
 * test keeps its own seed). */
static inline uint64_t check_xorshift(uint64_t *state) {
  *state ^= *state << 13;
  *state ^= *state >> 7;
  *state ^= *state << 17;
  return *state;
}

/* Threads of this process (Linux: /proc/self/status), or -1. */
static inline int check_thread_count(void) {
  FILE *f = fopen("/proc/self/status", "r");
  char line[256];
  int n = -1;
  while (f && fgets(line, sizeof line, f))
    if (!strncmp(line, "Threads:", 8)) n = atoi(line + 8);
  if (f) fclose(f);
  return n;
}

#endif
