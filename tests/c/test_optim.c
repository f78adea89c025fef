/*
 * test_optim.c -- the sparse optimizers' math against reference formulas.
 *
 * dynemb promises TensorFlow's exact optimizer math (SGD, Adagrad, lazy
 * Adam, FTRL-V2; and lazy AdamW, Adam with Loshchilov & Hutter's decoupled
 * weight decay, as Keras' AdamW writes it), so that a model trained on
 * dynemb tables matches one trained on dense tf.Variables. This test writes those formulas out once
 * more, plainly and in double precision, and checks the engine against them
 * for 200 steps of random gradients:
 *
 *  - on single rows through the internal dynemb_optim_apply (src/optim.h),
 *    for several dims (1, odd, 64) so vectorized loops and their tails are
 *    both covered;
 *  - on whole tables through the public dynemb_apply, with random batches
 *    that repeat keys (gradients summed first, as TF does for
 *    IndexedSlices), leave keys out (lazy Adam and AdamW: absent rows do
 *    not move, not even by weight decay, but the step count still
 *    advances) and name keys without a row;
 *  - bit for bit against the same formulas in plain scalar float code,
 *    whichever vector clone of the row math the CPU runs (optim.h);
 *  - the NaN/Inf policies (ERROR rejects the whole batch and names the
 *    table and key; SKIP skips those keys and counts them) and the
 *    validation of hyper-parameters.
 *
 * Each step is checked twice: "per step" (the reference starts from the
 * engine's own float state, so float rounding cannot accumulate; tight
 * tolerance) and "trajectory" (the reference runs on its own in double from
 * the initial values for all 200 steps; looser tolerance).
 */
#include <float.h>
#include <inttypes.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "dynemb.h"
#include "optim.h"

#define STEPS 200
#define STEP_RTOL 1e-5
#define STEP_ATOL 1e-6
#define TRAJ_RTOL 1e-4
#define TRAJ_ATOL 1e-5

/* ------------------------------------------------------------------------ */
/* Random numbers (splitmix64; the test must be reproducible)                */
/* ------------------------------------------------------------------------ */

static uint64_t rng_state = 0x5eed0f7e57ULL;

static uint64_t rng_next(void) {
  uint64_t z = (rng_state += 0x9e3779b97f4a7c15ULL);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

/* Uniform in [0, 1). */
static double rng_unit(void) { return (double)(rng_next() >> 11) * 0x1p-53; }

/* A gradient element: mostly uniform in [-1, 1), sometimes exactly 0 (an
 * element the loss does not depend on), sometimes large. */
static float rng_grad(void) {
  double u = rng_unit();
  if (u < 0.05)
    return 0.0f;
  if (u < 0.10)
    return (float)(8.0 * (rng_unit() - 0.5));
  return (float)(2.0 * rng_unit() - 1.0);
}

/* ------------------------------------------------------------------------ */
/* Reference formulas (double precision)                                     */
/* ------------------------------------------------------------------------ */

/* Slots per row, written out again (not taken from the engine). */
static int ref_slots(int kind) {
  switch (kind) {
  case DYNEMB_OPT_SGD:
    return 0;
  case DYNEMB_OPT_ADAGRAD:
    return 1;
  case DYNEMB_OPT_ADAM:
    return 2;
  case DYNEMB_OPT_FTRL:
    return 2;
  case DYNEMB_OPT_ADAMW:
    return 2;
  default:
    return -1;
  }
}

/* Initial slot values of a new row: Adagrad accum = initial_accumulator_value;
 * Adam, AdamW m = v = 0; FTRL accum = initial_accumulator_value, linear = 0. */
static void ref_init_slots(const dynemb_optimizer *o, double *slots, int dim) {
  for (int i = 0; i < dim * ref_slots(o->kind); i++)
    slots[i] = 0.0;
  if (o->kind == DYNEMB_OPT_ADAGRAD || o->kind == DYNEMB_OPT_FTRL)
    for (int i = 0; i < dim; i++)
      slots[i] = (double)o->initial_accumulator_value;
}

/* One optimizer step on row `w` (embedding then slots) with the summed
 * gradient `g`, learning rate `lr` and 1-based step `step`, as TF's
 * training_ops kernels define it. Hyper-parameters are the float values of
 * the configuration, widened. */
static void ref_step(const dynemb_optimizer *o, double *w, int dim,
                     const double *g, double lr, uint64_t step) {
  double *s1 = w + dim, *s2 = w + 2 * dim;
  switch (o->kind) {
  case DYNEMB_OPT_SGD: /* ApplyGradientDescent */
    for (int i = 0; i < dim; i++)
      w[i] -= lr * g[i];
    break;
  case DYNEMB_OPT_ADAGRAD: /* ApplyAdagrad, update_slots = true */
    for (int i = 0; i < dim; i++) {
      s1[i] += g[i] * g[i];
      w[i] -= lr * g[i] / sqrt(s1[i]);
    }
    break;
  case DYNEMB_OPT_ADAM: { /* lazy Adam with beta powers beta^step */
    double b1 = (double)o->beta1, b2 = (double)o->beta2;
    double eps = (double)o->epsilon;
    double b1p = pow(b1, (double)step), b2p = pow(b2, (double)step);
    double lr_t = lr * sqrt(1.0 - b2p) / (1.0 - b1p);
    for (int i = 0; i < dim; i++) {
      s1[i] = b1 * s1[i] + (1.0 - b1) * g[i];
      s2[i] = b2 * s2[i] + (1.0 - b2) * g[i] * g[i];
      w[i] -= lr_t * s1[i] / (sqrt(s2[i]) + eps);
    }
    break;
  }
  case DYNEMB_OPT_ADAMW: { /* Loshchilov & Hutter, Algorithm 2 */
    /* theta_t = theta_{t-1} - eta_t * (alpha * mhat / (sqrt(vhat) + eps)
     *                                   + lambda * theta_{t-1})
     * with eta_t * alpha = lr and eta_t * lambda = lr * weight_decay (the
     * decay scales with the learning rate, as in Keras and PyTorch), and
     * TF's epsilon-hat form of the Adam part (epsilon added to sqrt(v),
     * the bias correction folded into the step size), as for Adam above. */
    double b1 = (double)o->beta1, b2 = (double)o->beta2;
    double eps = (double)o->epsilon, wd = (double)o->weight_decay;
    double b1p = pow(b1, (double)step), b2p = pow(b2, (double)step);
    double lr_t = lr * sqrt(1.0 - b2p) / (1.0 - b1p);
    for (int i = 0; i < dim; i++) {
      double theta = w[i];
      s1[i] = b1 * s1[i] + (1.0 - b1) * g[i];
      s2[i] = b2 * s2[i] + (1.0 - b2) * g[i] * g[i];
      w[i] = theta - lr * wd * theta - lr_t * s1[i] / (sqrt(s2[i]) + eps);
    }
    break;
  }
  case DYNEMB_OPT_FTRL: { /* ApplyFtrlV2 */
    double p = (double)o->learning_rate_power;
    double l1 = (double)o->l1, l2 = (double)o->l2;
    double shrink = (double)o->l2_shrinkage;
    for (int i = 0; i < dim; i++) {
      double accum = s1[i], linear = s2[i];
      double g_s = g[i] + 2.0 * shrink * w[i];
      double new_accum = accum + g[i] * g[i];
      linear += g_s - (pow(new_accum, -p) - pow(accum, -p)) / lr * w[i];
      double quadratic = pow(new_accum, -p) / lr + 2.0 * l2;
      if (fabs(linear) > l1)
        w[i] = ((linear > 0 ? l1 : -l1) - linear) / quadratic;
      else
        w[i] = 0.0;
      s1[i] = new_accum;
      s2[i] = linear;
    }
    break;
  }
  default:
    break;
  }
}

/* ------------------------------------------------------------------------ */
/* Comparison helpers                                                        */
/* ------------------------------------------------------------------------ */

/* Compares `n` engine floats with reference doubles:
 * |got - want| <= rtol * max(|want|, |prev|) + atol, where prev (may be NULL)
 * is the element's value before the step (so a value that cancels to near
 * zero is judged against the size of what cancelled). Prints the first few
 * mismatches with `what`; returns the number of mismatches. */
static int compare_row(const char *what, long step, const float *got,
                       const double *want, const double *prev, int n,
                       double rtol, double atol) {
  static int printed;
  int bad = 0;
  for (int i = 0; i < n; i++) {
    double scale = fabs(want[i]);
    if (prev && fabs(prev[i]) > scale)
      scale = fabs(prev[i]);
    double err = fabs((double)got[i] - want[i]);
    if (!(err <= rtol * scale + atol)) { /* also catches NaN */
      bad++;
      if (printed < 12) {
        printed++;
        fprintf(stderr, "  %s step %ld element %d: got %.9g, want %.9g\n", what,
                step, i, (double)got[i], want[i]);
      }
    }
  }
  return bad;
}

static void widen(const float *in, double *out, int n) {
  for (int i = 0; i < n; i++)
    out[i] = (double)in[i];
}

/* ------------------------------------------------------------------------ */
/* Optimizer configurations under test                                       */
/* ------------------------------------------------------------------------ */

typedef struct opt_case {
  const char *label;
  dynemb_optimizer opt;
} opt_case;

/* TF's defaults come from dynemb_table_config_init (checked below). */
static dynemb_optimizer default_opt(int kind, float lr) {
  dynemb_table_config cfg;
  dynemb_table_config_init(&cfg);
  cfg.optimizer.kind = kind;
  cfg.optimizer.learning_rate = lr;
  return cfg.optimizer;
}

#define N_CASES 13
static opt_case cases[N_CASES];

static void make_cases(void) {
  int k = 0;
  cases[k].label = "sgd";
  cases[k++].opt = default_opt(DYNEMB_OPT_SGD, 0.1f);

  cases[k].label = "adagrad";
  cases[k++].opt = default_opt(DYNEMB_OPT_ADAGRAD, 0.05f);

  cases[k].label = "adagrad_iav1.5";
  cases[k].opt = default_opt(DYNEMB_OPT_ADAGRAD, 0.3f);
  cases[k++].opt.initial_accumulator_value = 1.5f;

  cases[k].label = "adam";
  cases[k++].opt = default_opt(DYNEMB_OPT_ADAM, 0.01f);

  cases[k].label = "adam_b0.5_0.9_eps1e-3";
  cases[k].opt = default_opt(DYNEMB_OPT_ADAM, 0.02f);
  cases[k].opt.beta1 = 0.5f;
  cases[k].opt.beta2 = 0.9f;
  cases[k++].opt.epsilon = 1e-3f;

  cases[k].label = "adam_beta1_0";
  cases[k].opt = default_opt(DYNEMB_OPT_ADAM, 0.01f);
  cases[k++].opt.beta1 = 0.0f;

  cases[k].label = "ftrl";
  cases[k++].opt = default_opt(DYNEMB_OPT_FTRL, 0.05f);

  cases[k].label = "ftrl_l1_l2";
  cases[k].opt = default_opt(DYNEMB_OPT_FTRL, 0.1f);
  cases[k].opt.l1 = 0.3f;
  cases[k++].opt.l2 = 0.2f;

  cases[k].label = "ftrl_l1_l2_shrink_p-0.3";
  cases[k].opt = default_opt(DYNEMB_OPT_FTRL, 0.2f);
  cases[k].opt.l1 = 0.05f;
  cases[k].opt.l2 = 0.1f;
  cases[k].opt.l2_shrinkage = 0.07f;
  cases[k].opt.learning_rate_power = -0.3f;
  cases[k++].opt.initial_accumulator_value = 0.5f;

  cases[k].label = "adamw";
  cases[k++].opt = default_opt(DYNEMB_OPT_ADAMW, 0.01f);

  /* A decay large enough to dominate the Adam step (lr * wd = 0.06). */
  cases[k].label = "adamw_wd3_b0.5_0.9";
  cases[k].opt = default_opt(DYNEMB_OPT_ADAMW, 0.02f);
  cases[k].opt.weight_decay = 3.0f;
  cases[k].opt.beta1 = 0.5f;
  cases[k++].opt.beta2 = 0.9f;

  cases[k].label = "adamw_wd0"; /* = Adam */
  cases[k].opt = default_opt(DYNEMB_OPT_ADAMW, 0.01f);
  cases[k++].opt.weight_decay = 0.0f;

  cases[k].label = "ftrl_p0_shrink";
  cases[k].opt = default_opt(DYNEMB_OPT_FTRL, 0.03f);
  cases[k].opt.learning_rate_power = 0.0f;
  cases[k].opt.l2_shrinkage = 0.2f;
  cases[k++].opt.l1 = 0.01f;
}

/* The learning rate of step `s`: varies a little, as a decay schedule
 * would. */
static float step_lr(const dynemb_optimizer *o, long s) {
  return (float)((double)o->learning_rate *
                 (1.0 + 0.25 * sin(0.1 * (double)s)));
}

/* ------------------------------------------------------------------------ */
/* Tests on the internal row API                                             */
/* ------------------------------------------------------------------------ */

static void test_config_defaults_are_tf_defaults(void) {
  dynemb_table_config cfg;
  memset(&cfg, 0x5a, sizeof cfg);
  dynemb_table_config_init(&cfg);
  CHECK(cfg.optimizer.kind == DYNEMB_OPT_SGD);
  CHECK(cfg.optimizer.learning_rate == 0.01f);
  CHECK(cfg.optimizer.initial_accumulator_value == 0.1f);
  CHECK(cfg.optimizer.beta1 == 0.9f);
  CHECK(cfg.optimizer.beta2 == 0.999f);
  CHECK(cfg.optimizer.epsilon == 1e-8f);
  CHECK(cfg.optimizer.learning_rate_power == -0.5f);
  CHECK(cfg.optimizer.l1 == 0.0f);
  CHECK(cfg.optimizer.l2 == 0.0f);
  CHECK(cfg.optimizer.l2_shrinkage == 0.0f);
  CHECK(cfg.optimizer.weight_decay == 0.004f); /* Keras' AdamW, mxRec's */
  CHECK(cfg.nonfinite_policy == DYNEMB_NONFINITE_ERROR);
}

static void test_slot_counts_and_names(void) {
  CHECK(dynemb_optim_slot_count(DYNEMB_OPT_SGD) == 0);
  CHECK(dynemb_optim_slot_count(DYNEMB_OPT_ADAGRAD) == 1);
  CHECK(dynemb_optim_slot_count(DYNEMB_OPT_ADAM) == 2);
  CHECK(dynemb_optim_slot_count(DYNEMB_OPT_FTRL) == 2);
  CHECK(dynemb_optim_slot_count(DYNEMB_OPT_ADAMW) == 2);
  CHECK(DYNEMB_OPT_ADAMW == 4); /* in checkpoints: the number must not move */
  CHECK(dynemb_optim_slot_count(5) == -1);
  CHECK(dynemb_optim_slot_count(-1) == -1);
  CHECK(!strcmp(dynemb_optimizer_name(DYNEMB_OPT_SGD), "sgd"));
  CHECK(!strcmp(dynemb_optimizer_name(DYNEMB_OPT_ADAGRAD), "adagrad"));
  CHECK(!strcmp(dynemb_optimizer_name(DYNEMB_OPT_ADAM), "adam"));
  CHECK(!strcmp(dynemb_optimizer_name(DYNEMB_OPT_FTRL), "ftrl"));
  CHECK(!strcmp(dynemb_optimizer_name(DYNEMB_OPT_ADAMW), "adamw"));
  CHECK(!strcmp(dynemb_optimizer_name(99), "unknown"));
}

static void test_init_slots(void) {
  enum { DIM = 9 };
  for (int c = 0; c < N_CASES; c++) {
    const dynemb_optimizer *o = &cases[c].opt;
    int ns = ref_slots(o->kind);
    float slots[2 * DIM + 1];
    double want[2 * DIM];
    for (int i = 0; i < 2 * DIM + 1; i++)
      slots[i] = -777.0f;
    dynemb_optim_init_slots(o, slots, DIM);
    ref_init_slots(o, want, DIM);
    CHECK(compare_row(cases[c].label, 0, slots, want, NULL, ns * DIM, 0, 0) ==
          0);
    /* Writes exactly its slots, nothing beyond. */
    CHECK(slots[ns * DIM] == -777.0f);
  }
}

/* 200 steps of dynemb_optim_apply on one row of width `dim`. */
static void run_row_case(const opt_case *oc, int dim) {
  const dynemb_optimizer *o = &oc->opt;
  int rf = dim * (1 + ref_slots(o->kind));
  float *row = malloc(sizeof(float) * (size_t)(rf + 1));
  float *grad = malloc(sizeof(float) * (size_t)dim);
  double *traj = malloc(sizeof(double) * (size_t)rf);
  double *want = malloc(sizeof(double) * (size_t)rf);
  double *prev = malloc(sizeof(double) * (size_t)rf);
  double *g = malloc(sizeof(double) * (size_t)dim);
  char what[96];
  snprintf(what, sizeof what, "%s dim %d", oc->label, dim);

  for (int i = 0; i < dim; i++)
    row[i] = (float)(rng_unit() - 0.5);
  dynemb_optim_init_slots(o, row + dim, dim);
  row[rf] = 12345.0f; /* guard */
  widen(row, traj, dim);
  ref_init_slots(o, traj + dim, dim);

  int bad_step = 0, bad_traj = 0;
  for (long s = 1; s <= STEPS; s++) {
    float lr = step_lr(o, s);
    for (int i = 0; i < dim; i++) {
      grad[i] = rng_grad();
      g[i] = (double)grad[i];
    }
    widen(row, prev, rf);
    memcpy(want, prev, sizeof(double) * (size_t)rf);
    ref_step(o, want, dim, g, (double)lr, (uint64_t)s);
    ref_step(o, traj, dim, g, (double)lr, (uint64_t)s);
    dynemb_optim_apply(o, row, grad, dim, lr, (uint64_t)s);
    bad_step += compare_row(what, s, row, want, prev, rf, STEP_RTOL, STEP_ATOL);
  }
  bad_traj +=
      compare_row(what, -STEPS, row, traj, NULL, rf, TRAJ_RTOL, TRAJ_ATOL);
  CHECK(bad_step == 0);
  CHECK(bad_traj == 0);
  CHECK(row[rf] == 12345.0f);
  free(row);
  free(grad);
  free(traj);
  free(want);
  free(prev);
  free(g);
}

static void test_row_math_all_optimizers(void) {
  static const int dims[] = {1, 13, 64};
  for (int c = 0; c < N_CASES; c++)
    for (size_t d = 0; d < sizeof dims / sizeof dims[0]; d++)
      run_row_case(&cases[c], dims[d]);
}

/* The same bits as plain scalar float code, element by element: the
 * engine's loops run in whichever vector clone the CPU picked (optim.h),
 * and no width, fused multiply-add or reassociation may change a result.
 * The reference is TF's kernel arithmetic in float, one element at a time
 * (ApplyAdam: m += (g - m) * (1 - beta1), v += (g^2 - v) * (1 - beta2),
 * var -= m * alpha / (sqrt(v) + eps); ApplyAdagrad; ApplyGradientDescent;
 * ApplyFtrlV2 with learning_rate_power -0.5). Dims cover each clone's
 * full vectors and tails. */
static float bits_ref(const dynemb_optim_step *s, float *var, float *slots,
                      const float *g, int dim, int i) {
  float *a = slots, *b = slots + dim;
  switch (s->kind) {
  case DYNEMB_OPT_SGD: return var[i] - s->lr * g[i];
  case DYNEMB_OPT_ADAGRAD: {
    a[i] = a[i] + g[i] * g[i];
    return var[i] - s->lr * g[i] / sqrtf(a[i]);
  }
  case DYNEMB_OPT_ADAM: {
    a[i] = a[i] + (g[i] - a[i]) * s->one_minus_b1;
    b[i] = b[i] + (g[i] * g[i] - b[i]) * s->one_minus_b2;
    return var[i] - (a[i] * s->alpha) / (sqrtf(b[i]) + s->epsilon);
  }
  case DYNEMB_OPT_ADAMW: { /* decay first (Keras' order), then Adam */
    a[i] = a[i] + (g[i] - a[i]) * s->one_minus_b1;
    b[i] = b[i] + (g[i] * g[i] - b[i]) * s->one_minus_b2;
    float decayed = var[i] - var[i] * s->decay;
    return decayed - (a[i] * s->alpha) / (sqrtf(b[i]) + s->epsilon);
  }
  default: { /* FTRL, lr_power -0.5 */
    float gs = g[i] + 2.0f * s->l2_shrinkage * var[i];
    float na = a[i] + g[i] * g[i];
    float np = sqrtf(na), op = sqrtf(a[i]);
    b[i] += gs - (np - op) / s->lr * var[i];
    float quad = np / s->lr + 2.0f * s->l2;
    float out = 0.0f;
    if (fabsf(b[i]) > s->l1) {
      float sign = b[i] > 0.0f ? 1.0f : (b[i] < 0.0f ? -1.0f : 0.0f);
      out = (sign * s->l1 - b[i]) / quad;
    }
    a[i] = na;
    return out;
  }
  }
}

static void test_row_math_same_bits_as_scalar(void) {
  static const int dims[] = {1, 7, 8, 15, 16, 17, 31, 64, 67, 200};
  static const int kinds[] = {DYNEMB_OPT_SGD, DYNEMB_OPT_ADAGRAD,
                              DYNEMB_OPT_ADAM, DYNEMB_OPT_FTRL,
                              DYNEMB_OPT_ADAMW};
  uint64_t r = 12345;
  int mismatches = 0;
  for (size_t k = 0; k < sizeof kinds / sizeof kinds[0]; k++) {
    dynemb_optimizer o = default_opt(kinds[k], 0.05f);
    o.weight_decay = 0.7f;
    o.l1 = 0.001f;
    o.l2 = 0.01f;
    o.l2_shrinkage = kinds[k] == DYNEMB_OPT_FTRL ? 0.002f : 0.0f;
    for (size_t d = 0; d < sizeof dims / sizeof dims[0]; d++) {
      const int dim = dims[d];
      float *var = malloc(sizeof(float) * 3 * (size_t)dim), *slots = var + dim;
      float *rv = malloc(sizeof(float) * 3 * (size_t)dim), *rs = rv + dim;
      float *g = malloc(sizeof(float) * (size_t)dim);
      for (int i = 0; i < 3 * dim; i++) {
        r = r * 6364136223846793005ULL + 1442695040888963407ULL;
        var[i] = (float)((double)(r >> 40) / (double)(1 << 24)) * 0.5f + 0.01f;
      }
      memcpy(rv, var, sizeof(float) * 3 * (size_t)dim);
      for (uint64_t step = 1; step <= 20; step++) {
        for (int i = 0; i < dim; i++) {
          r = r * 6364136223846793005ULL + 1442695040888963407ULL;
          g[i] = (float)((double)(r >> 40) / (double)(1 << 24) - 0.5);
        }
        dynemb_optim_step s;
        dynemb_optim_prepare(&o, 0.05f, step, &s);
        dynemb_optim_apply_row(&s, var, slots, g, dim);
        for (int i = 0; i < dim; i++) rv[i] = bits_ref(&s, rv, rs, g, dim, i);
        mismatches += memcmp(var, rv, sizeof(float) * 3 * (size_t)dim) != 0;
        memcpy(rv, var, sizeof(float) * 3 * (size_t)dim); /* no drift */
      }
      free(var);
      free(rv);
      free(g);
    }
  }
  CHECK(mismatches == 0);
}

/* Adam's bias correction must use the step it is given, not count calls
 * itself: the same state and gradient at step 1 and step 50 differ. */
static void test_row_adam_uses_given_step(void) {
  dynemb_optimizer o = default_opt(DYNEMB_OPT_ADAM, 0.01f);
  enum { DIM = 4 };
  for (uint64_t step = 1; step <= 1000; step = step * 3 + 1) {
    float row[3 * DIM] = {0.5f, -0.25f, 0.0f, 1.0f};
    float grad[DIM] = {0.3f, -0.7f, 0.01f, 2.0f};
    double w[3 * DIM], g[DIM];
    dynemb_optim_init_slots(&o, row + DIM, DIM);
    /* A nonzero history, as after earlier steps. */
    for (int i = 0; i < DIM; i++) {
      row[DIM + i] = 0.1f * (float)(i + 1);
      row[2 * DIM + i] = 0.02f * (float)(i + 1);
    }
    widen(row, w, 3 * DIM);
    widen(grad, g, DIM);
    ref_step(&o, w, DIM, g, 0.01, step);
    dynemb_optim_apply(&o, row, grad, DIM, 0.01f, step);
    CHECK(compare_row("adam given step", (long)step, row, w, NULL, 3 * DIM,
                      STEP_RTOL, STEP_ATOL) == 0);
  }
}

/* ------------------------------------------------------------------------ */
/* Validation                                                                */
/* ------------------------------------------------------------------------ */

typedef struct bad_case {
  const char *label;
  const char *field; /* must appear in the message */
  dynemb_optimizer opt;
} bad_case;

static int make_bad_cases(bad_case *b) {
  int k = 0;
  b[k] = (bad_case){"negative learning rate", "learning_rate",
                    default_opt(DYNEMB_OPT_SGD, -0.1f)};
  k++;
  b[k] = (bad_case){"NaN learning rate", "learning_rate",
                    default_opt(DYNEMB_OPT_ADAGRAD, NAN)};
  k++;
  b[k] = (bad_case){"beta1 = 1", "beta1", default_opt(DYNEMB_OPT_ADAM, 0.01f)};
  b[k++].opt.beta1 = 1.0f;
  b[k] = (bad_case){"beta1 < 0", "beta1", default_opt(DYNEMB_OPT_ADAM, 0.01f)};
  b[k++].opt.beta1 = -0.1f;
  b[k] = (bad_case){"beta2 = 1", "beta2", default_opt(DYNEMB_OPT_ADAM, 0.01f)};
  b[k++].opt.beta2 = 1.0f;
  b[k] = (bad_case){"beta2 > 1", "beta2", default_opt(DYNEMB_OPT_ADAM, 0.01f)};
  b[k++].opt.beta2 = 1.5f;
  b[k] =
      (bad_case){"epsilon = 0", "epsilon", default_opt(DYNEMB_OPT_ADAM, 0.01f)};
  b[k++].opt.epsilon = 0.0f;
  b[k] =
      (bad_case){"epsilon < 0", "epsilon", default_opt(DYNEMB_OPT_ADAM, 0.01f)};
  b[k++].opt.epsilon = -1e-8f;
  b[k] = (bad_case){"l1 < 0", "l1", default_opt(DYNEMB_OPT_FTRL, 0.01f)};
  b[k++].opt.l1 = -0.5f;
  b[k] = (bad_case){"l2 < 0", "l2", default_opt(DYNEMB_OPT_FTRL, 0.01f)};
  b[k++].opt.l2 = -0.5f;
  b[k] = (bad_case){"l2_shrinkage < 0", "l2_shrinkage",
                    default_opt(DYNEMB_OPT_FTRL, 0.01f)};
  b[k++].opt.l2_shrinkage = -0.5f;
  b[k] = (bad_case){"learning_rate_power > 0", "learning_rate_power",
                    default_opt(DYNEMB_OPT_FTRL, 0.01f)};
  b[k++].opt.learning_rate_power = 0.5f;
  b[k] = (bad_case){"weight_decay < 0", "weight_decay",
                    default_opt(DYNEMB_OPT_ADAMW, 0.01f)};
  b[k++].opt.weight_decay = -0.1f;
  b[k] = (bad_case){"weight_decay = inf", "weight_decay",
                    default_opt(DYNEMB_OPT_ADAMW, 0.01f)};
  b[k++].opt.weight_decay = INFINITY;
  b[k] = (bad_case){"AdamW beta1 = 1", "beta1",
                    default_opt(DYNEMB_OPT_ADAMW, 0.01f)};
  b[k++].opt.beta1 = 1.0f;
  b[k] = (bad_case){"AdamW epsilon = 0", "epsilon",
                    default_opt(DYNEMB_OPT_ADAMW, 0.01f)};
  b[k++].opt.epsilon = 0.0f;
  b[k] =
      (bad_case){"unknown optimizer kind", "optimizer", default_opt(7, 0.01f)};
  k++;
  return k;
}

static void test_validate_rejects_bad_hyperparameters(void) {
  bad_case b[24];
  int n = make_bad_cases(b);
  for (int i = 0; i < n; i++) {
    int rc = dynemb_optim_validate(&b[i].opt, "tbl_validate");
    if (rc != DYNEMB_EINVAL) {
      fprintf(stderr, "  %s: dynemb_optim_validate returned %d, want EINVAL\n",
              b[i].label, rc);
      CHECK(rc == DYNEMB_EINVAL);
      continue;
    }
    const char *msg = dynemb_last_error();
    if (!strstr(msg, "tbl_validate") || !strstr(msg, b[i].field)) {
      fprintf(stderr,
              "  %s: message '%s' should name table 'tbl_validate' "
              "and field '%s'\n",
              b[i].label, msg, b[i].field);
      CHECK(0);
    }
  }
}

static void test_validate_accepts_edge_values(void) {
  dynemb_optimizer o;
  for (int c = 0; c < N_CASES; c++)
    CHECK_OK(dynemb_optim_validate(&cases[c].opt, "tbl_ok"));
  o = default_opt(DYNEMB_OPT_SGD, 0.0f); /* lr 0 is allowed (frozen) */
  CHECK_OK(dynemb_optim_validate(&o, "tbl_ok"));
  o = default_opt(DYNEMB_OPT_ADAM, 0.01f);
  o.beta1 = 0.0f;
  o.beta2 = 0.0f; /* [0, 1) includes 0 */
  CHECK_OK(dynemb_optim_validate(&o, "tbl_ok"));
  o = default_opt(DYNEMB_OPT_FTRL, 0.01f);
  o.learning_rate_power = 0.0f;
  o.l1 = 0.0f;
  o.l2 = 0.0f;
  o.l2_shrinkage = 0.0f;
  CHECK_OK(dynemb_optim_validate(&o, "tbl_ok"));
}

static void test_create_rejects_bad_hyperparameters(void) {
  bad_case b[24];
  int n = make_bad_cases(b);
  for (int i = 0; i < n; i++) {
    dynemb_table_config cfg;
    dynemb_table *t = NULL;
    dynemb_table_config_init(&cfg);
    cfg.name = "tbl_bad_hp";
    cfg.dim = 4;
    cfg.optimizer = b[i].opt;
    int rc = dynemb_table_create(&cfg, &t);
    if (rc != DYNEMB_EINVAL) {
      fprintf(stderr, "  %s: dynemb_table_create returned %d, want EINVAL\n",
              b[i].label, rc);
      CHECK(rc == DYNEMB_EINVAL);
      if (rc == DYNEMB_OK) {
        dynemb_table_drop("tbl_bad_hp");
        dynemb_table_release(t);
      }
      continue;
    }
    const char *msg = dynemb_last_error();
    if (!strstr(msg, "tbl_bad_hp") || !strstr(msg, b[i].field)) {
      fprintf(stderr,
              "  %s: message '%s' should name table 'tbl_bad_hp' and "
              "field '%s'\n",
              b[i].label, msg, b[i].field);
      CHECK(0);
    }
    /* A failed create registers nothing. */
    dynemb_table *found = NULL;
    CHECK_RC(dynemb_table_find("tbl_bad_hp", &found), DYNEMB_ENOTFOUND);
    dynemb_table_release(found);
  }
}

/* ------------------------------------------------------------------------ */
/* Tests through the public table API                                        */
/* ------------------------------------------------------------------------ */

static dynemb_table *make_table(const char *name, int dim,
                                const dynemb_optimizer *o, int policy) {
  dynemb_table_config cfg;
  dynemb_table *t = NULL;
  dynemb_table_config_init(&cfg);
  cfg.name = name;
  cfg.dim = dim;
  cfg.optimizer = *o;
  cfg.nonfinite_policy = policy;
  cfg.init.kind = DYNEMB_INIT_UNIFORM;
  cfg.init.a = -0.5f;
  cfg.init.b = 0.5f;
  cfg.init.seed = 42;
  CHECK_OK(dynemb_table_create(&cfg, &t));
  return t;
}

/* Inserts `n` keys (train-mode lookup). */
static void insert_keys(dynemb_table *t, const int64_t *keys, size_t n) {
  float *out = malloc(sizeof(float) * n * (size_t)dynemb_table_dim(t));
  CHECK_OK(dynemb_lookup(t, keys, n, DYNEMB_LOOKUP_TRAIN, 0, NULL, out, NULL));
  free(out);
}

static long snap_find(const dynemb_snapshot *s, int64_t key) {
  size_t lo = 0, hi = s->rows;
  while (lo < hi) { /* rows are sorted by key */
    size_t mid = lo + (hi - lo) / 2;
    if (s->keys[mid] < key)
      lo = mid + 1;
    else
      hi = mid;
  }
  return (lo < s->rows && s->keys[lo] == key) ? (long)lo : -1;
}

#define NKEYS 40
#define MAXBATCH 64

/* The pool of keys with rows: extremes and ordinary ids. */
static void make_keys(int64_t *keys) {
  keys[0] = 0;
  keys[1] = -1;
  keys[2] = INT64_MAX;
  keys[3] = INT64_MIN;
  for (int i = 4; i < NKEYS; i++)
    keys[i] = (int64_t)(rng_next() >> 20) - 1000;
}

/* 200 random batches through dynemb_apply, checked step by step and as a
 * whole trajectory; batches hold about reps/2 occurrences per distinct key
 * (3: about half are repeats; 6: most are, which apply sums differently). */
static void run_table_case(const opt_case *oc, int dim, int reps) {
  const dynemb_optimizer *o = &oc->opt;
  char name[96];
  snprintf(name, sizeof name, "optim_%s_d%d_r%d", oc->label, dim, reps);
  dynemb_table *t = make_table(name, dim, o, DYNEMB_NONFINITE_ERROR);
  if (!t)
    return;
  int rf = dim * (1 + ref_slots(o->kind));
  CHECK(dynemb_table_row_floats(t) == rf);

  int64_t keys[NKEYS];
  make_keys(keys);
  insert_keys(t, keys, NKEYS);

  /* Trajectory state per key, from the table's initial rows. */
  double *traj = malloc(sizeof(double) * (size_t)(NKEYS * rf));
  dynemb_snapshot s0;
  CHECK_OK(dynemb_table_snapshot(t, &s0));
  CHECK(s0.rows == NKEYS && s0.row_floats == rf);
  CHECK(s0.apply_steps == 0);
  for (int k = 0; k < NKEYS; k++) {
    long r = snap_find(&s0, keys[k]);
    CHECK(r >= 0);
    if (r < 0)
      continue;
    widen(s0.values + (size_t)r * (size_t)rf, traj + (size_t)k * (size_t)rf,
          dim);
    ref_init_slots(o, traj + (size_t)k * (size_t)rf + dim, dim);
    /* The table's fresh slots are the reference's. */
    CHECK(compare_row(
              "fresh slots", 0, s0.values + (size_t)r * (size_t)rf + dim,
              traj + (size_t)k * (size_t)rf + dim, NULL, rf - dim, 0, 0) == 0);
  }

  int64_t bkeys[MAXBATCH];
  float *grads = malloc(sizeof(float) * MAXBATCH * (size_t)dim);
  double *gsum = malloc(sizeof(double) * NKEYS * (size_t)dim);
  double *want = malloc(sizeof(double) * (size_t)rf);
  double *prev = malloc(sizeof(double) * (size_t)rf);
  int present[NKEYS];
  int bad_step = 0, bad_lazy = 0, bad_stats = 0;
  size_t total_applied = 0, total_dropped = 0;
  char what[128];
  snprintf(what, sizeof what, "table %s", name);

  dynemb_snapshot before = s0;
  for (long s = 1; s <= STEPS; s++) {
    /* A batch: a random subset of the keys, each possibly repeated; now and
     * then one key that has no row. */
    size_t n = 0;
    int subset = 1 + (int)(rng_unit() * NKEYS);
    memset(present, 0, sizeof present);
    for (int k = 0; k < NKEYS * dim; k++)
      gsum[k] = 0.0;
    while (n < MAXBATCH - 1 && n < (size_t)(subset * reps / 2)) {
      int k = (int)(rng_unit() * subset);
      bkeys[n] = keys[k];
      present[k] = 1;
      for (int i = 0; i < dim; i++) {
        float gv = rng_grad();
        grads[n * (size_t)dim + (size_t)i] = gv;
        gsum[(size_t)k * (size_t)dim + (size_t)i] += (double)gv;
      }
      n++;
    }
    int with_unknown = rng_unit() < 0.3;
    if (with_unknown) { /* a key without a row, gradients dropped */
      bkeys[n] = 987654321 + s;
      for (int i = 0; i < dim; i++)
        grads[n * (size_t)dim + (size_t)i] = 1.0f;
      n++;
    }
    /* Shuffle so that repeated keys are not adjacent. */
    for (size_t i = n - 1; i > 0; i--) {
      size_t j = (size_t)(rng_unit() * (double)(i + 1));
      int64_t tk = bkeys[i];
      bkeys[i] = bkeys[j];
      bkeys[j] = tk;
      for (int e = 0; e < dim; e++) {
        float tg = grads[i * (size_t)dim + (size_t)e];
        grads[i * (size_t)dim + (size_t)e] = grads[j * (size_t)dim + (size_t)e];
        grads[j * (size_t)dim + (size_t)e] = tg;
      }
    }
    int distinct = 0;
    for (int k = 0; k < NKEYS; k++)
      distinct += present[k];

    /* Odd steps use the configured rate (lr < 0), even steps pass one. */
    float lr = (s % 2) ? o->learning_rate : step_lr(o, s);
    float lr_arg = (s % 2) ? -1.0f : lr;

    dynemb_apply_stats st;
    memset(&st, 0xff, sizeof st);
    CHECK_OK(dynemb_apply(t, bkeys, n, grads, lr_arg, NULL, &st));
    if (st.unique_keys != (size_t)distinct + (size_t)with_unknown ||
        st.applied != (size_t)distinct ||
        st.dropped_unknown != (size_t)with_unknown ||
        st.skipped_nonfinite != 0) {
      if (!bad_stats)
        fprintf(stderr,
                "  %s step %ld: stats unique %zu applied %zu dropped "
                "%zu skipped %zu, want %d %d %d 0\n",
                what, s, st.unique_keys, st.applied, st.dropped_unknown,
                st.skipped_nonfinite, distinct + with_unknown, distinct,
                with_unknown);
      bad_stats++;
    }
    total_applied += (size_t)distinct;
    total_dropped += (size_t)with_unknown;

    dynemb_snapshot after;
    CHECK_OK(dynemb_table_snapshot(t, &after));
    CHECK(after.rows == NKEYS); /* apply never inserts */
    CHECK(after.apply_steps == (uint64_t)s);
    for (int k = 0; k < NKEYS; k++) {
      long rb = snap_find(&before, keys[k]), ra = snap_find(&after, keys[k]);
      if (rb < 0 || ra < 0) {
        bad_step++;
        continue;
      }
      const float *fb = before.values + (size_t)rb * (size_t)rf;
      const float *fa = after.values + (size_t)ra * (size_t)rf;
      double *tr = traj + (size_t)k * (size_t)rf;
      if (!present[k]) { /* lazy: not in the batch, not moved at all */
        if (memcmp(fb, fa, sizeof(float) * (size_t)rf))
          bad_lazy++;
        continue;
      }
      const double *g = gsum + (size_t)k * (size_t)dim;
      widen(fb, prev, rf);
      memcpy(want, prev, sizeof(double) * (size_t)rf);
      ref_step(o, want, dim, g, (double)lr, (uint64_t)s);
      ref_step(o, tr, dim, g, (double)lr, (uint64_t)s);
      bad_step +=
          compare_row(what, s, fa, want, prev, rf, STEP_RTOL, STEP_ATOL);
    }
    if (before.keys != s0.keys)
      dynemb_snapshot_free(&before);
    before = after;
  }

  int bad_traj = 0;
  for (int k = 0; k < NKEYS; k++) {
    long r = snap_find(&before, keys[k]);
    if (r < 0)
      continue;
    bad_traj += compare_row(
        what, -STEPS, before.values + (size_t)r * (size_t)rf,
        traj + (size_t)k * (size_t)rf, NULL, rf, TRAJ_RTOL, TRAJ_ATOL);
  }
  if (before.keys != s0.keys)
    dynemb_snapshot_free(&before);
  dynemb_snapshot_free(&s0);

  dynemb_table_stats ts;
  dynemb_table_get_stats(t, &ts);
  CHECK(ts.apply_steps == STEPS);
  CHECK(ts.applied == total_applied);
  CHECK(ts.dropped_gradients == total_dropped);
  CHECK(ts.nonfinite_skipped == 0);
  CHECK(ts.size == NKEYS);

  CHECK(bad_step == 0);
  CHECK(bad_lazy == 0);
  CHECK(bad_stats == 0);
  CHECK(bad_traj == 0);
  if (bad_lazy)
    fprintf(stderr, "  %s: %d rows absent from a batch moved\n", what,
            bad_lazy);

  free(traj);
  free(grads);
  free(gsum);
  free(want);
  free(prev);
  CHECK_OK(dynemb_table_drop(name));
  dynemb_table_release(t);
}

static void test_table_apply_all_optimizers(void) {
  for (int c = 0; c < N_CASES; c++) {
    run_table_case(&cases[c], 8, 3);
    run_table_case(&cases[c], 3, 3);
    run_table_case(&cases[c], 16, 6);
    run_table_case(&cases[c], 1, 6);
  }
}

/* A batch where one key appears many times: one update with the summed
 * gradient, not several updates (they differ for every optimizer but SGD,
 * and for SGD the check still catches a lost or doubled occurrence). */
static void test_table_repeated_key_summed_once(void) {
  for (int c = 0; c < N_CASES; c++) {
    const dynemb_optimizer *o = &cases[c].opt;
    enum { DIM = 5, REP = 7 };
    int rf = DIM * (1 + ref_slots(o->kind));
    dynemb_table *t =
        make_table("optim_repeat", DIM, o, DYNEMB_NONFINITE_ERROR);
    if (!t)
      continue;
    int64_t key = 77;
    insert_keys(t, &key, 1);
    dynemb_snapshot s0, s1;
    CHECK_OK(dynemb_table_snapshot(t, &s0));
    int64_t keys[REP];
    float grads[REP * DIM];
    double g[DIM] = {0}, w[3 * DIM];
    for (int r = 0; r < REP; r++) {
      keys[r] = key;
      for (int i = 0; i < DIM; i++) {
        grads[r * DIM + i] = (float)(0.1 * (r + 1) * (i % 2 ? -1 : 1));
        g[i] += (double)grads[r * DIM + i];
      }
    }
    dynemb_apply_stats st;
    CHECK_OK(dynemb_apply(t, keys, REP, grads, -1.0f, NULL, &st));
    CHECK(st.unique_keys == 1 && st.applied == 1);
    CHECK_OK(dynemb_table_snapshot(t, &s1));
    if (s0.rows == 1 && s1.rows == 1) {
      widen(s0.values, w, rf);
      ref_step(o, w, DIM, g, (double)o->learning_rate, 1);
      CHECK(compare_row(cases[c].label, 1, s1.values, w, NULL, rf, STEP_RTOL,
                        STEP_ATOL) == 0);
    } else {
      CHECK(0);
    }
    dynemb_table_stats ts;
    dynemb_table_get_stats(t, &ts);
    CHECK(ts.applied == 1);
    CHECK(ts.apply_steps == 1);
    dynemb_snapshot_free(&s0);
    dynemb_snapshot_free(&s1);
    CHECK_OK(dynemb_table_drop("optim_repeat"));
    dynemb_table_release(t);
  }
}

/* Lazy Adam: a row skipped for several steps keeps its m and v (no decay)
 * and, when it comes back, its bias correction uses the table's step count
 * (every apply call counts, including calls that touch other rows only). */
static void test_table_lazy_adam_step_count(void) {
  dynemb_optimizer o = default_opt(DYNEMB_OPT_ADAM, 0.01f);
  enum { DIM = 4 };
  dynemb_table *t =
      make_table("optim_lazy_adam", DIM, &o, DYNEMB_NONFINITE_ERROR);
  if (!t)
    return;
  int64_t keys[2] = {1, 2};
  insert_keys(t, keys, 2);
  float grad[DIM] = {0.5f, -0.5f, 0.25f, 1.0f};
  dynemb_snapshot s0, s1;
  CHECK_OK(dynemb_table_snapshot(t, &s0));
  double w1[3 * DIM];
  long r1 = snap_find(&s0, 1);
  CHECK(r1 >= 0);
  if (r1 < 0) {
    dynemb_snapshot_free(&s0);
    return;
  }
  widen(s0.values + r1 * 3 * DIM, w1, 3 * DIM);
  double g[DIM];
  widen(grad, g, DIM);
  /* step 1: key 1; steps 2..6: key 2 only; step 7: key 1 again. */
  CHECK_OK(dynemb_apply(t, &keys[0], 1, grad, -1.0f, NULL, NULL));
  ref_step(&o, w1, DIM, g, 0.01, 1);
  for (int s = 2; s <= 6; s++)
    CHECK_OK(dynemb_apply(t, &keys[1], 1, grad, -1.0f, NULL, NULL));
  CHECK_OK(dynemb_apply(t, &keys[0], 1, grad, -1.0f, NULL, NULL));
  ref_step(&o, w1, DIM, g, 0.01, 7);
  CHECK_OK(dynemb_table_snapshot(t, &s1));
  CHECK(s1.apply_steps == 7);
  long r = snap_find(&s1, 1);
  CHECK(r >= 0);
  if (r >= 0)
    CHECK(compare_row("lazy adam", 7, s1.values + r * 3 * DIM, w1, NULL,
                      3 * DIM, STEP_RTOL, STEP_ATOL) == 0);
  dynemb_snapshot_free(&s0);
  dynemb_snapshot_free(&s1);
  CHECK_OK(dynemb_table_drop("optim_lazy_adam"));
  dynemb_table_release(t);
}

static int snapshots_equal(const dynemb_snapshot *a, const dynemb_snapshot *b) {
  if (a->rows != b->rows || a->row_floats != b->row_floats ||
      a->apply_steps != b->apply_steps)
    return 0;
  if (a->rows == 0)
    return 1;
  return !memcmp(a->keys, b->keys, sizeof(int64_t) * a->rows) &&
         !memcmp(a->values, b->values,
                 sizeof(float) * a->rows * (size_t)a->row_floats);
}

/* Policy ERROR: a NaN or Inf anywhere rejects the whole batch; nothing
 * changes (not even Adam's step count) and the message names the table and
 * the key. */
static void test_nonfinite_error_policy(void) {
  static const float bad_values[3] = {NAN, INFINITY, -INFINITY};
  dynemb_optimizer o = default_opt(DYNEMB_OPT_ADAM, 0.01f);
  enum { DIM = 6, N = 5 };
  dynemb_table *t =
      make_table("optim_nan_error", DIM, &o, DYNEMB_NONFINITE_ERROR);
  if (!t)
    return;
  int64_t keys[N] = {10, 20, 123456789, 40, 50};
  insert_keys(t, keys, N);
  float grads[N * DIM];
  for (int i = 0; i < N * DIM; i++)
    grads[i] = rng_grad();
  CHECK_OK(dynemb_apply(t, keys, N, grads, -1.0f, NULL, NULL)); /* step 1 */

  for (int b = 0; b < 3; b++) {
    dynemb_snapshot s0, s1;
    CHECK_OK(dynemb_table_snapshot(t, &s0));
    float bad[N * DIM];
    memcpy(bad, grads, sizeof bad);
    bad[2 * DIM + 3] = bad_values[b]; /* key 123456789, element 3 */
    dynemb_apply_stats st;
    CHECK_RC(dynemb_apply(t, keys, N, bad, -1.0f, NULL, &st),
             DYNEMB_ENONFINITE);
    const char *msg = dynemb_last_error();
    if (!strstr(msg, "optim_nan_error") || !strstr(msg, "123456789")) {
      fprintf(stderr,
              "  ENONFINITE message '%s' should name table "
              "'optim_nan_error' and key 123456789\n",
              msg);
      CHECK(0);
    }
    CHECK_OK(dynemb_table_snapshot(t, &s1));
    CHECK(snapshots_equal(&s0, &s1));
    CHECK(s1.apply_steps == 1);
    dynemb_snapshot_free(&s0);
    dynemb_snapshot_free(&s1);
  }

  /* NaN gradients for a key without a row and for a key with one: the
   * batch is rejected and nothing moves. */
  {
    dynemb_snapshot s0, s1;
    CHECK_OK(dynemb_table_snapshot(t, &s0));
    int64_t k2[2] = {999999, 10};
    float g2[2 * DIM];
    for (int i = 0; i < 2 * DIM; i++)
      g2[i] = NAN;
    int rc = dynemb_apply(t, k2, 2, g2, -1.0f, NULL, NULL);
    CHECK(rc == DYNEMB_ENONFINITE);
    CHECK_OK(dynemb_table_snapshot(t, &s1));
    CHECK(snapshots_equal(&s0, &s1));
    dynemb_snapshot_free(&s0);
    dynemb_snapshot_free(&s1);
  }

  /* The next good batch is step 2, exactly. */
  {
    dynemb_snapshot s0, s1;
    CHECK_OK(dynemb_table_snapshot(t, &s0));
    CHECK_OK(dynemb_apply(t, keys, N, grads, -1.0f, NULL, NULL));
    CHECK_OK(dynemb_table_snapshot(t, &s1));
    CHECK(s1.apply_steps == 2);
    int bad = 0;
    for (int k = 0; k < N && s0.rows == N && s1.rows == N; k++) {
      double w[3 * DIM], g[DIM];
      long r0 = snap_find(&s0, keys[k]), r1 = snap_find(&s1, keys[k]);
      widen(s0.values + r0 * 3 * DIM, w, 3 * DIM);
      widen(grads + k * DIM, g, DIM);
      ref_step(&o, w, DIM, g, 0.01, 2);
      bad += compare_row("after rejected batches", 2, s1.values + r1 * 3 * DIM,
                         w, NULL, 3 * DIM, STEP_RTOL, STEP_ATOL);
    }
    CHECK(bad == 0);
    dynemb_snapshot_free(&s0);
    dynemb_snapshot_free(&s1);
  }
  dynemb_table_stats ts;
  dynemb_table_get_stats(t, &ts);
  CHECK(ts.apply_steps == 2);
  CHECK(ts.applied == 2 * N);
  CHECK(ts.nonfinite_skipped == 0);
  CHECK_OK(dynemb_table_drop("optim_nan_error"));
  dynemb_table_release(t);
}

/* Policy SKIP: keys with a NaN/Inf gradient (in any occurrence, since the
 * sum is then not finite) keep their rows untouched, slots included; the
 * other keys are applied normally; the skips are counted. */
static void test_nonfinite_skip_policy(void) {
  for (int c = 0; c < N_CASES; c++) {
    const dynemb_optimizer *o = &cases[c].opt;
    enum { DIM = 4, N = 6 };
    int rf = DIM * (1 + ref_slots(o->kind));
    dynemb_table *t =
        make_table("optim_nan_skip", DIM, o, DYNEMB_NONFINITE_SKIP);
    if (!t)
      continue;
    /* keys: 1 NaN, 2 +Inf, 3 fine, 4 fine, 5 NaN in its second occurrence */
    int64_t ukeys[5] = {1, 2, 3, 4, 5};
    insert_keys(t, ukeys, 5);
    int64_t keys[N] = {1, 5, 2, 3, 4, 5};
    float grads[N * DIM];
    for (int i = 0; i < N * DIM; i++)
      grads[i] = rng_grad();
    grads[0 * DIM + 1] = NAN;
    grads[2 * DIM + 0] = INFINITY;
    grads[5 * DIM + 3] = -NAN;
    dynemb_snapshot s0, s1;
    CHECK_OK(dynemb_table_snapshot(t, &s0));
    dynemb_apply_stats st;
    CHECK_OK(dynemb_apply(t, keys, N, grads, -1.0f, NULL, &st));
    CHECK(st.unique_keys == 5);
    CHECK(st.applied == 2);
    CHECK(st.skipped_nonfinite == 3);
    CHECK(st.dropped_unknown == 0);
    CHECK_OK(dynemb_table_snapshot(t, &s1));
    CHECK(s1.apply_steps == 1);
    for (int k = 0; k < 5 && s0.rows == 5 && s1.rows == 5; k++) {
      long r0 = snap_find(&s0, ukeys[k]), r1 = snap_find(&s1, ukeys[k]);
      const float *f0 = s0.values + r0 * rf, *f1 = s1.values + r1 * rf;
      if (ukeys[k] == 3 || ukeys[k] == 4) {
        int j = ukeys[k] == 3 ? 3 : 4; /* position in keys[] */
        double w[3 * DIM], g[DIM];
        widen(f0, w, rf);
        widen(grads + j * DIM, g, DIM);
        ref_step(o, w, DIM, g, (double)o->learning_rate, 1);
        CHECK(compare_row(cases[c].label, 1, f1, w, NULL, rf, STEP_RTOL,
                          STEP_ATOL) == 0);
      } else {
        CHECK(!memcmp(f0, f1, sizeof(float) * (size_t)rf));
      }
      for (int i = 0; i < rf; i++)
        CHECK(isfinite(f1[i]));
    }
    dynemb_table_stats ts;
    dynemb_table_get_stats(t, &ts);
    CHECK(ts.applied == 2);
    CHECK(ts.nonfinite_skipped >= 3); /* 3 keys (4 gradient rows) */
    dynemb_snapshot_free(&s0);
    dynemb_snapshot_free(&s1);
    CHECK_OK(dynemb_table_drop("optim_nan_skip"));
    dynemb_table_release(t);
  }
}

/* Both policies on a batch made mostly of repeats (apply then sums every
 * key's rows into one array and checks that array): ERROR names the key and
 * moves nothing; SKIP leaves exactly the keys with a bad occurrence, and the
 * others get their summed gradient. */
static void test_nonfinite_mostly_repeats(void) {
  enum { DIM = 16, N = 12 };
  dynemb_optimizer o = default_opt(DYNEMB_OPT_ADAGRAD, 0.1f);
  int64_t ukeys[5] = {1, 2, 3, 4, 5};
  /* key 5's third occurrence is NaN; key 2's second is -Inf */
  const int64_t keys[N] = {1, 5, 2, 3, 4, 5, 3, 3, 4, 2, 1, 5};
  float grads[N * DIM];
  for (int i = 0; i < N * DIM; i++)
    grads[i] = rng_grad();
  grads[11 * DIM + 7] = NAN;
  grads[9 * DIM + 0] = -INFINITY;
  for (int policy = 0; policy < 2; policy++) {
    dynemb_table *t = make_table("optim_nan_repeats", DIM, &o,
                                 policy ? DYNEMB_NONFINITE_SKIP
                                        : DYNEMB_NONFINITE_ERROR);
    if (!t)
      return;
    insert_keys(t, ukeys, 5);
    dynemb_snapshot s0, s1;
    CHECK_OK(dynemb_table_snapshot(t, &s0));
    dynemb_apply_stats st;
    int rc = dynemb_apply(t, keys, N, grads, -1.0f, NULL, &st);
    char msg[512];
    snprintf(msg, sizeof msg, "%s", dynemb_last_error());
    CHECK_OK(dynemb_table_snapshot(t, &s1));
    if (!policy) {
      CHECK(rc == DYNEMB_ENONFINITE);
      /* the first bad gradient in batch order: key 2 at position 9 */
      CHECK(strstr(msg, "optim_nan_repeats") != NULL);
      CHECK(strstr(msg, "key 2 ") != NULL);
      CHECK(strstr(msg, "position 9") != NULL);
      CHECK(snapshots_equal(&s0, &s1));
    } else {
      CHECK_OK(rc);
      CHECK(st.unique_keys == 5 && st.applied == 3 &&
            st.skipped_nonfinite == 2);
      for (int k = 0; k < 5 && s0.rows == 5 && s1.rows == 5; k++) {
        long r0 = snap_find(&s0, ukeys[k]), r1 = snap_find(&s1, ukeys[k]);
        const float *f0 = s0.values + r0 * 2 * DIM;
        const float *f1 = s1.values + r1 * 2 * DIM;
        if (ukeys[k] == 2 || ukeys[k] == 5) {
          CHECK(!memcmp(f0, f1, sizeof(float) * 2 * DIM));
          continue;
        }
        double w[2 * DIM], g[DIM] = {0};
        widen(f0, w, 2 * DIM);
        for (int i = 0; i < N; i++)
          if (keys[i] == ukeys[k])
            for (int e = 0; e < DIM; e++)
              g[e] += (double)grads[i * DIM + e];
        ref_step(&o, w, DIM, g, 0.1, 1);
        CHECK(compare_row("mostly repeats", 1, f1, w, NULL, 2 * DIM,
                          STEP_RTOL, STEP_ATOL) == 0);
      }
    }
    dynemb_snapshot_free(&s0);
    dynemb_snapshot_free(&s1);
    CHECK_OK(dynemb_table_drop("optim_nan_repeats"));
    dynemb_table_release(t);
  }
}

static void test_apply_argument_errors(void) {
  dynemb_optimizer o = default_opt(DYNEMB_OPT_SGD, 0.01f);
  dynemb_table *t = make_table("optim_args", 2, &o, DYNEMB_NONFINITE_ERROR);
  if (!t)
    return;
  int64_t key = 3;
  float g[2] = {1.0f, 1.0f};
  insert_keys(t, &key, 1);
  CHECK_RC(dynemb_apply(t, NULL, 1, g, -1.0f, NULL, NULL), DYNEMB_EINVAL);
  CHECK_RC(dynemb_apply(t, &key, 1, NULL, -1.0f, NULL, NULL), DYNEMB_EINVAL);
  CHECK_RC(dynemb_apply(t, &key, 1, g, NAN, NULL, NULL), DYNEMB_EINVAL);
  dynemb_table_stats ts;
  dynemb_table_get_stats(t, &ts);
  CHECK(ts.applied == 0 && ts.apply_steps == 0);
  /* lr 0 is valid and changes no embedding. */
  dynemb_snapshot s0, s1;
  CHECK_OK(dynemb_table_snapshot(t, &s0));
  CHECK_OK(dynemb_apply(t, &key, 1, g, 0.0f, NULL, NULL));
  CHECK_OK(dynemb_table_snapshot(t, &s1));
  CHECK(s0.rows == 1 && s1.rows == 1 &&
        !memcmp(s0.values, s1.values, sizeof(float) * 2));
  dynemb_snapshot_free(&s0);
  dynemb_snapshot_free(&s1);
  CHECK_OK(dynemb_table_drop("optim_args"));
  dynemb_table_release(t);
}

int main(void) {
  make_cases();
  RUN(test_config_defaults_are_tf_defaults);
  RUN(test_slot_counts_and_names);
  RUN(test_init_slots);
  RUN(test_row_math_all_optimizers);
  RUN(test_row_math_same_bits_as_scalar);
  RUN(test_row_adam_uses_given_step);
  RUN(test_validate_rejects_bad_hyperparameters);
  RUN(test_validate_accepts_edge_values);
  RUN(test_create_rejects_bad_hyperparameters);
  RUN(test_table_apply_all_optimizers);
  RUN(test_table_repeated_key_summed_once);
  RUN(test_table_lazy_adam_step_count);
  RUN(test_nonfinite_error_policy);
  RUN(test_nonfinite_skip_policy);
  RUN(test_nonfinite_mostly_repeats);
  RUN(test_apply_argument_errors);
  dynemb_registry_clear();
  return check_summary();
}
