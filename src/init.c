/*
 * init.c -- initial row values from a counter-based generator.
 *
 * Every random number is dynemb_hash64 of a counter built from the table
 * seed, the key and the element index (plus a redraw number for the
 * truncated normal), so a value never depends on which thread inserts the
 * row, in which batch, in which shard or after how many evictions.
 *
 *   stream(seed, key) = hash64(hash_key(key) ^ hash64(seed ^ C1))
 *   word(j)           = hash64(stream + (j + 1) * C2)      (64 random bits)
 *
 * Uniform uses 24-bit halves of word(j/2) (bits 40..63 for even j, bits
 * 8..31 for odd j; 24 bits are exact in a float). Normal uses
 * Box-Muller on word(j/2): its high and low 32 bits give two uniforms and
 * the pair (cos, sin) fills elements 2k and 2k+1. Truncated normal draws
 * element j from word(j + draw * 2^32) (one Box-Muller value per draw) and
 * redraws while the value is outside mean +- 2 stddev.
 */
#include "init.h"

#include <math.h>

#include "error.h"
#include "hash.h"

#define C1 0x6a09e667f3bcc909ULL /* seed whitening constant */
#define C2 0x9e3779b97f4a7c15ULL /* golden-ratio counter increment */
#define MAX_REDRAWS 64 /* P(64 redraws) = 0.0455^64: never in practice */

static const double two_pi = 6.283185307179586476925286766559;

int dynemb_init_validate(const dynemb_initializer *init,
                         const char *table_name) {
  const char *t = table_name ? table_name : "?";
  switch (init->kind) {
  case DYNEMB_INIT_ZEROS: return DYNEMB_OK;
  case DYNEMB_INIT_CONSTANT:
    if (!isfinite(init->a))
      return dynemb_error_set(DYNEMB_EINVAL,
                              "table '%s': constant initializer value "
                              "init.a = %g is not finite; use a finite value",
                              t, (double)init->a);
    return DYNEMB_OK;
  case DYNEMB_INIT_UNIFORM:
    if (!isfinite(init->a) || !isfinite(init->b) || !(init->a < init->b))
      return dynemb_error_set(DYNEMB_EINVAL,
                              "table '%s': uniform initializer needs finite "
                              "init.a (min) < init.b (max), got [%g, %g); "
                              "set min below max",
                              t, (double)init->a, (double)init->b);
    return DYNEMB_OK;
  case DYNEMB_INIT_NORMAL:
  case DYNEMB_INIT_TRUNCATED_NORMAL:
    if (!isfinite(init->a))
      return dynemb_error_set(DYNEMB_EINVAL,
                              "table '%s': normal initializer mean init.a = "
                              "%g is not finite; use a finite mean",
                              t, (double)init->a);
    if (!isfinite(init->b) || !(init->b >= 0))
      return dynemb_error_set(DYNEMB_EINVAL,
                              "table '%s': normal initializer stddev init.b "
                              "= %g is invalid; it must be finite and >= 0",
                              t, (double)init->b);
    return DYNEMB_OK;
  default:
    return dynemb_error_set(DYNEMB_EINVAL,
                            "table '%s': unknown initializer kind init.kind "
                            "= %d; use DYNEMB_INIT_ZEROS, _CONSTANT, "
                            "_UNIFORM, _NORMAL or _TRUNCATED_NORMAL",
                            t, init->kind);
  }
}

static inline uint64_t word(uint64_t stream, uint64_t j) {
  return dynemb_hash64(stream + (j + 1) * C2);
}

/* Two independent uniforms from one word: u1 in (0, 1], u2 in [0, 1). */
static inline void box_muller(uint64_t w, double *z0, double *z1) {
  double u1 = ((double)(w >> 32) + 1.0) * (1.0 / 4294967296.0);
  double u2 = (double)(uint32_t)w * (1.0 / 4294967296.0);
  double r = sqrt(-2.0 * log(u1));
  double ang = two_pi * u2;
#ifdef __GLIBC__
  double s, c;
  sincos(ang, &s, &c);
  *z0 = r * c;
  if (z1) *z1 = r * s;
#else
  *z0 = r * cos(ang);
  if (z1) *z1 = r * sin(ang);
#endif
}

void dynemb_init_row(const dynemb_initializer *init, int64_t key, float *out,
                     int dim) {
  uint64_t stream = dynemb_hash64(dynemb_hash_key(key) ^ dynemb_hash64(init->seed ^ C1));
  switch (init->kind) {
  case DYNEMB_INIT_CONSTANT:
    for (int j = 0; j < dim; j++) out[j] = init->a;
    return;
  case DYNEMB_INIT_UNIFORM: {
    float lo = init->a, hi = init->b;
    double span = (double)hi - (double)lo;
    uint64_t w = 0;
    for (int j = 0; j < dim; j++) {
      if (!(j & 1)) w = word(stream, (uint64_t)(j / 2));
      uint32_t bits = (uint32_t)(j & 1 ? (w >> 8) & 0xffffff : w >> 40);
      double u = (double)bits * (1.0 / 16777216.0);
      float v = (float)((double)lo + span * u);
      if (v >= hi) v = nextafterf(hi, lo); /* rounding must not reach max */
      if (v < lo) v = lo;
      out[j] = v;
    }
    return;
  }
  case DYNEMB_INIT_NORMAL: {
    double mean = init->a, sd = init->b;
    int j = 0;
    for (; j + 1 < dim; j += 2) {
      double z0, z1;
      box_muller(word(stream, (uint64_t)(j / 2)), &z0, &z1);
      out[j] = (float)(mean + sd * z0);
      out[j + 1] = (float)(mean + sd * z1);
    }
    if (j < dim) {
      double z0;
      box_muller(word(stream, (uint64_t)(j / 2)), &z0, NULL);
      out[j] = (float)(mean + sd * z0);
    }
    return;
  }
  case DYNEMB_INIT_TRUNCATED_NORMAL: {
    double mean = init->a, sd = init->b;
    for (int j = 0; j < dim; j++) {
      double z = 0;
      for (uint64_t d = 0; d < MAX_REDRAWS; d++) {
        double c;
        box_muller(word(stream, (uint64_t)j + (d << 32)), &c, NULL);
        if (fabs(c) <= 2.0) {
          z = c;
          break;
        }
      }
      float v = (float)(mean + sd * z);
      /* float rounding must not leave [mean - 2sd, mean + 2sd] */
      float lo = (float)(mean - 2 * sd), hi = (float)(mean + 2 * sd);
      out[j] = v < lo ? lo : v > hi ? hi : v;
    }
    return;
  }
  case DYNEMB_INIT_ZEROS:
  default:
    for (int j = 0; j < dim; j++) out[j] = 0.0f;
    return;
  }
}
