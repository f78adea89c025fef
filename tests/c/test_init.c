/*
 * test_init.c -- tests of the counter-based row initializers (src/init.c):
 * determinism, dependence on seed/key only, distribution moments of
 * uniform/normal/truncated normal, their CDFs at points in the body, the
 * wedges and the tail, truncation bounds, independence of
 * neighbouring elements and keys, and validation messages.
 */
#include <float.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "dynemb.h"
#include "init.h"

enum { DIM = 16, KEYS = 20000 };

typedef struct moments {
  double mean, var, skew, kurt, min, max;
} moments;

static moments sample(const dynemb_initializer *in, float *buf) {
  /* buf: KEYS * DIM values */
  for (int k = 0; k < KEYS; k++) dynemb_init_row(in, (int64_t)k * 1000003 - 7, buf + k * DIM, DIM);
  size_t n = (size_t)KEYS * DIM;
  double s = 0, mn = DBL_MAX, mx = -DBL_MAX;
  for (size_t i = 0; i < n; i++) {
    s += buf[i];
    if (buf[i] < mn) mn = buf[i];
    if (buf[i] > mx) mx = buf[i];
  }
  double mean = s / (double)n, m2 = 0, m3 = 0, m4 = 0;
  for (size_t i = 0; i < n; i++) {
    double d = buf[i] - mean;
    m2 += d * d;
    m3 += d * d * d;
    m4 += d * d * d * d;
  }
  m2 /= (double)n;
  m3 /= (double)n;
  m4 /= (double)n;
  moments m = {mean, m2, m3 / pow(m2, 1.5), m4 / (m2 * m2), mn, mx};
  return m;
}

static void test_determinism(void) {
  dynemb_initializer in = {DYNEMB_INIT_NORMAL, 0, 1, 1234};
  float a[DIM], b[DIM], c[DIM], d[DIM], p[5];
  dynemb_init_row(&in, 42, a, DIM);
  dynemb_init_row(&in, 43, c, DIM);
  dynemb_init_row(&in, 42, b, DIM);
  CHECK(memcmp(a, b, sizeof a) == 0);
  CHECK(memcmp(a, c, sizeof a) != 0);
  in.seed = 1235;
  dynemb_init_row(&in, 42, d, DIM);
  CHECK(memcmp(a, d, sizeof a) != 0);
  /* a shorter row is a prefix of a longer one (odd length included) */
  in.seed = 1234;
  dynemb_init_row(&in, 42, p, 5);
  CHECK(memcmp(a, p, sizeof p) == 0);
  in.kind = DYNEMB_INIT_UNIFORM;
  in.a = -1;
  in.b = 1;
  dynemb_init_row(&in, 42, a, DIM);
  dynemb_init_row(&in, 42, p, 5);
  CHECK(memcmp(a, p, sizeof p) == 0);
  in.kind = DYNEMB_INIT_TRUNCATED_NORMAL;
  dynemb_init_row(&in, -9, a, DIM);
  dynemb_init_row(&in, -9, b, DIM);
  CHECK(memcmp(a, b, sizeof a) == 0);
  /* elements of one row differ */
  int distinct = 0;
  for (int j = 1; j < DIM; j++) distinct += a[j] != a[0];
  CHECK(distinct == DIM - 1);
}

static void test_zeros_constant(void) {
  dynemb_initializer in = {DYNEMB_INIT_ZEROS, 3, 4, 1};
  float a[7];
  memset(a, 0x7f, sizeof a);
  dynemb_init_row(&in, 5, a, 7);
  for (int j = 0; j < 7; j++) CHECK(a[j] == 0.0f);
  in.kind = DYNEMB_INIT_CONSTANT;
  in.a = -2.5f;
  dynemb_init_row(&in, INT64_MIN, a, 7);
  for (int j = 0; j < 7; j++) CHECK(a[j] == -2.5f);
}

static void test_uniform(void) {
  float *buf = malloc(sizeof(float) * KEYS * DIM);
  dynemb_initializer in = {DYNEMB_INIT_UNIFORM, -0.5f, 1.5f, 9};
  moments m = sample(&in, buf);
  CHECK(m.min >= -0.5 && m.max < 1.5);
  CHECK(m.min < -0.49 && m.max > 1.49);
  CHECK_NEAR(m.mean, 0.5, 0, 0.01);
  CHECK_NEAR(m.var, 4.0 / 12.0, 0.02, 0);
  CHECK_NEAR(m.skew, 0, 0, 0.02);
  CHECK_NEAR(m.kurt, 1.8, 0.02, 0);
  /* elements 0 and 1 share one hash word: they must be uncorrelated */
  double c01 = 0;
  for (int k = 0; k < KEYS; k++) c01 += (buf[k * DIM] - 0.5) * (buf[k * DIM + 1] - 0.5);
  CHECK_NEAR(c01 / KEYS / (4.0 / 12.0), 0, 0, 0.03);
  /* tiny interval: rounding must never produce max */
  dynemb_initializer t = {DYNEMB_INIT_UNIFORM, 1.0f, nextafterf(1.0f, 2.0f), 3};
  float v[DIM];
  for (int k = 0; k < 1000; k++) {
    dynemb_init_row(&t, k, v, DIM);
    for (int j = 0; j < DIM; j++) CHECK(v[j] == 1.0f);
  }
  free(buf);
}

static void test_normal(void) {
  float *buf = malloc(sizeof(float) * KEYS * DIM);
  dynemb_initializer in = {DYNEMB_INIT_NORMAL, 2.0f, 0.5f, 77};
  moments m = sample(&in, buf);
  CHECK_NEAR(m.mean, 2.0, 0, 0.005);
  CHECK_NEAR(m.var, 0.25, 0.02, 0);
  CHECK_NEAR(m.skew, 0, 0, 0.03);
  CHECK_NEAR(m.kurt, 3.0, 0.03, 0);
  /* fraction within one stddev */
  size_t n = (size_t)KEYS * DIM, in1 = 0;
  for (size_t i = 0; i < n; i++) in1 += fabs(buf[i] - 2.0) < 0.5;
  CHECK_NEAR((double)in1 / (double)n, 0.682689, 0, 0.005);
  /* neighbouring elements (a Box-Muller pair) and keys are uncorrelated */
  double c01 = 0, ck = 0;
  for (int k = 0; k + 1 < KEYS; k++) {
    c01 += (buf[k * DIM] - 2.0) * (buf[k * DIM + 1] - 2.0);
    ck += (buf[k * DIM + 3] - 2.0) * (buf[(k + 1) * DIM + 3] - 2.0);
  }
  CHECK_NEAR(c01 / (KEYS - 1) / 0.25, 0, 0, 0.03);
  CHECK_NEAR(ck / (KEYS - 1) / 0.25, 0, 0, 0.03);
  /* the CDF at points in the layers' rectangles, the wedges and the tail
   * (beyond 3.44 the ziggurat takes its tail path): the observed fraction
   * below x is within 4 standard errors of Phi(x) */
  static const double xs[] = {-3.6, -3.0, -2.2, -1.3, -0.4, 0.1,
                              0.9,  1.7,  2.6,  3.2,  3.6};
  for (size_t q = 0; q < sizeof xs / sizeof xs[0]; q++) {
    size_t below = 0;
    for (size_t i = 0; i < n; i++) below += (buf[i] - 2.0) / 0.5 < xs[q];
    double p = 0.5 * erfc(-xs[q] / sqrt(2.0));
    double se = sqrt(p * (1 - p) / (double)n);
    CHECK_NEAR((double)below / (double)n, p, 0, 4 * se + 1e-6);
  }
  /* stddev 0 gives the mean */
  dynemb_initializer z = {DYNEMB_INIT_NORMAL, 1.25f, 0.0f, 1};
  float v[3];
  dynemb_init_row(&z, 8, v, 3);
  CHECK(v[0] == 1.25f && v[1] == 1.25f && v[2] == 1.25f);
  free(buf);
}

static void test_truncated_normal(void) {
  float *buf = malloc(sizeof(float) * KEYS * DIM);
  dynemb_initializer in = {DYNEMB_INIT_TRUNCATED_NORMAL, -1.0f, 0.1f, 5};
  moments m = sample(&in, buf);
  CHECK(m.min >= -1.2f && m.max <= -0.8f);
  CHECK(m.min < -1.19 && m.max > -0.81); /* the bounds are reached */
  CHECK_NEAR(m.mean, -1.0, 0, 0.001);
  /* variance of N(0,1) truncated to [-2, 2]: 1 - 4 phi(2) / (2 Phi(2) - 1) */
  double phi2 = exp(-2.0) / sqrt(2 * M_PI);
  double want = 1 - 4 * phi2 / erf(2 / sqrt(2.0));
  CHECK_NEAR(m.var / 0.01, want, 0.02, 0);
  CHECK_NEAR(m.skew, 0, 0, 0.03);
  /* the CDF of N(0,1) truncated to [-2, 2] at a few points */
  static const double xs[] = {-1.9, -1.1, -0.3, 0.6, 1.5, 1.95};
  size_t n = (size_t)KEYS * DIM;
  const double p_lo = 0.5 * erfc(2.0 / sqrt(2.0)), mass = 1 - 2 * p_lo;
  for (size_t q = 0; q < sizeof xs / sizeof xs[0]; q++) {
    size_t below = 0;
    for (size_t i = 0; i < n; i++) below += (buf[i] + 1.0) / 0.1 < xs[q];
    double p = (0.5 * erfc(-xs[q] / sqrt(2.0)) - p_lo) / mass;
    double se = sqrt(p * (1 - p) / (double)n);
    CHECK_NEAR((double)below / (double)n, p, 0, 4 * se + 1e-6);
  }
  free(buf);
}

static void test_validate(void) {
  dynemb_initializer in = {DYNEMB_INIT_UNIFORM, 2, 1, 0};
  CHECK_RC(dynemb_init_validate(&in, "tbl"), DYNEMB_EINVAL);
  CHECK(strstr(dynemb_last_error(), "'tbl'") && strstr(dynemb_last_error(), "max"));
  in.a = NAN;
  in.b = 1;
  CHECK_RC(dynemb_init_validate(&in, "tbl"), DYNEMB_EINVAL);
  in.a = 0;
  CHECK_OK(dynemb_init_validate(&in, "tbl"));
  in.kind = DYNEMB_INIT_NORMAL;
  in.b = INFINITY;
  CHECK_RC(dynemb_init_validate(&in, "tbl"), DYNEMB_EINVAL);
  CHECK(strstr(dynemb_last_error(), "stddev") != NULL);
  in.kind = DYNEMB_INIT_TRUNCATED_NORMAL;
  in.b = -0.1f;
  CHECK_RC(dynemb_init_validate(&in, "tbl"), DYNEMB_EINVAL);
  in.b = 0.1f;
  CHECK_OK(dynemb_init_validate(&in, "tbl"));
  in.kind = 5;
  CHECK_RC(dynemb_init_validate(&in, "tbl"), DYNEMB_EINVAL);
  CHECK(strstr(dynemb_last_error(), "init.kind") != NULL);
  in.kind = DYNEMB_INIT_ZEROS;
  in.a = NAN; /* ignored */
  CHECK_OK(dynemb_init_validate(&in, "tbl"));
}

int main(void) {
  RUN(test_determinism);
  RUN(test_zeros_constant);
  RUN(test_uniform);
  RUN(test_normal);
  RUN(test_truncated_normal);
  RUN(test_validate);
  return check_summary();
}
