/*
 * init.c -- initial row values from a counter-based generator.
 *
 * Every random number is dynemb_hash64 of a counter built from the table
 * seed, the key, the element index and a draw number, so a value never
 * depends on which thread inserts the row, in which batch, in which shard
 * or after how many evictions.
 *
 *   stream(seed, key) = hash64(hash_key(key) ^ hash64(seed ^ C1))
 *   word(c)           = hash64(stream + (c + 1) * C2)      (64 random bits)
 *
 * Uniform uses 24-bit halves of word(j/2) (bits 40..63 for even j, bits
 * 8..31 for odd j; 24 bits are exact in a float). Normal and truncated
 * normal draw element j with the ziggurat method (Marsaglia and Tsang, 128
 * layers) from words j + d * 2^32, d = 0, 1, ...: one word (layer from its
 * high bits, value from its low 32 bits) settles ~99% of draws with a
 * compare and a multiply; the rest take more words (the wedges, the tail).
 * It replaced Box-Muller (a log, a sqrt and a sincos per pair, in double),
 * which made initializing a 64-float row from a truncated normal cost
 * ~2.1 us, most of the cost of inserting a key (docs/benchmark-journal.md).
 * Truncated normal redraws while the value is outside mean +- 2 stddev.
 */
#include "init.h"

#include <math.h>
#include <pthread.h>

#include "error.h"
#include "hash.h"

#define C1 0x6a09e667f3bcc909ULL /* seed whitening constant */
#define C2 0x9e3779b97f4a7c15ULL /* golden-ratio counter increment */
#define MAX_REDRAWS 64 /* P(64 redraws) = 0.0455^64: never in practice */

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

/* Ziggurat tables for N(0, 1), 128 layers: kn (fast-path bounds on the
 * 31-bit magnitude), wn (scale to a value), fn (density at layer edges).
 * Computed once, with Marsaglia and Tsang's constants. */
#define ZIG_R 3.442619855899      /* start of the tail */
#define ZIG_V 9.91256303526217e-3 /* area of each layer */
static uint32_t zig_kn[128];
static double zig_wn[128], zig_fn[128];
static pthread_once_t zig_once = PTHREAD_ONCE_INIT;

static void zig_setup(void) {
  const double m1 = 2147483648.0;
  double dn = ZIG_R, tn = dn;
  const double q = ZIG_V / exp(-0.5 * dn * dn);
  zig_kn[0] = (uint32_t)((dn / q) * m1);
  zig_kn[1] = 0;
  zig_wn[0] = q / m1;
  zig_wn[127] = dn / m1;
  zig_fn[0] = 1.0;
  zig_fn[127] = exp(-0.5 * dn * dn);
  for (int i = 126; i >= 1; i--) {
    dn = sqrt(-2.0 * log(ZIG_V / dn + exp(-0.5 * dn * dn)));
    zig_kn[i + 1] = (uint32_t)((dn / tn) * m1);
    tn = dn;
    zig_fn[i] = exp(-0.5 * dn * dn);
    zig_wn[i] = dn / m1;
  }
}

/* The words of one element: word(stream, j + d * 2^32), d = 0, 1, ... */
typedef struct draws {
  uint64_t stream, j, d;
} draws;

static inline uint64_t next_word(draws *g) {
  return word(g->stream, g->j + (g->d++ << 32));
}

/* A uniform in (0, 1) from the top 53 bits of the next word. */
static double next_open01(draws *g) {
  return ((double)(next_word(g) >> 11) + 0.5) * (1.0 / 9007199254740992.0);
}

/* One N(0, 1) draw. The layer comes from the word's top 7 bits and the
 * signed 32-bit value from its low bits (apart: the classic version took
 * both from the same bits, a known flaw). */
static double normal(draws *g) {
  for (;;) {
    const uint64_t w = next_word(g);
    const uint32_t iz = (uint32_t)(w >> 57);
    const int32_t hz = (int32_t)(uint32_t)w;
    const uint32_t mag = hz < 0 ? (uint32_t)0 - (uint32_t)hz : (uint32_t)hz;
    const double x = (double)hz * zig_wn[iz];
    if (mag < zig_kn[iz]) return x; /* inside the layer's rectangle */
    if (iz == 0) { /* the tail beyond ZIG_R */
      double t, y;
      do {
        t = -log(next_open01(g)) / ZIG_R;
        y = -log(next_open01(g));
      } while (y + y < t * t);
      return hz > 0 ? ZIG_R + t : -ZIG_R - t;
    }
    /* the wedge between the layer's rectangle and the density */
    if (zig_fn[iz] + next_open01(g) * (zig_fn[iz - 1] - zig_fn[iz]) <
        exp(-0.5 * x * x))
      return x;
  }
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
  case DYNEMB_INIT_NORMAL:
  case DYNEMB_INIT_TRUNCATED_NORMAL: {
    pthread_once(&zig_once, zig_setup);
    const int trunc = init->kind == DYNEMB_INIT_TRUNCATED_NORMAL;
    const double mean = init->a, sd = init->b;
    /* float rounding must not leave [mean - 2sd, mean + 2sd] */
    const float lo = (float)(mean - 2 * sd), hi = (float)(mean + 2 * sd);
    for (int j = 0; j < dim; j++) {
      draws g = {stream, (uint64_t)j, 0};
      double z = normal(&g);
      for (int r = 1; trunc && fabs(z) > 2.0; r++)
        z = r < MAX_REDRAWS ? normal(&g) : 0.0;
      float v = (float)(mean + sd * z);
      if (trunc) v = v < lo ? lo : v > hi ? hi : v;
      out[j] = v;
    }
    return;
  }
  case DYNEMB_INIT_ZEROS:
  default:
    for (int j = 0; j < dim; j++) out[j] = 0.0f;
    return;
  }
}
