/*
 * optim.c -- sparse optimizer math on one row, with TensorFlow's formulas.
 *
 * The table sums the gradients of repeated keys and then calls
 * dynemb_optim_apply once per row, so a dynemb table trained with these
 * functions follows the same trajectory as a dense tf.Variable trained with
 * tf.compat.v1's GradientDescent / Adagrad / Adam / Ftrl optimizers (Adam is
 * "lazy": rows absent from a batch keep their moments, as in TF-Addons'
 * LazyAdam; on batches where every row appears it equals dense Adam).
 * AdamW is that lazy Adam with decoupled weight decay (Loshchilov & Hutter,
 * "Decoupled Weight Decay Regularization"): the row shrinks by
 * lr * weight_decay times its value before the step, in the convention of
 * Keras' and PyTorch's AdamW (weight_decay is per unit learning rate, so a
 * learning-rate schedule scales the decay too, the paper's eta_t). Lazy as
 * well: a row absent from a batch is neither stepped nor decayed, because
 * decaying every row on every step would touch the whole table.
 *
 * Slot layout after the `dim` embedding floats:
 *   ADAGRAD: accum[dim]          ADAM, ADAMW: m[dim], v[dim]
 *   FTRL:    accum[dim], linear[dim]
 */
#include "optim.h"

#include <math.h>

#include "error.h"

int dynemb_optim_slot_count(int kind) {
  switch (kind) {
  case DYNEMB_OPT_SGD: return 0;
  case DYNEMB_OPT_ADAGRAD: return 1;
  case DYNEMB_OPT_ADAM: return 2;
  case DYNEMB_OPT_FTRL: return 2;
  case DYNEMB_OPT_ADAMW: return 2;
  default: return -1;
  }
}

const char *dynemb_optimizer_name(int kind) {
  switch (kind) {
  case DYNEMB_OPT_SGD: return "sgd";
  case DYNEMB_OPT_ADAGRAD: return "adagrad";
  case DYNEMB_OPT_ADAM: return "adam";
  case DYNEMB_OPT_FTRL: return "ftrl";
  case DYNEMB_OPT_ADAMW: return "adamw";
  default: return "unknown";
  }
}

static int bad(const char *table, const char *field, double value,
               const char *rule) {
  return dynemb_error_set(DYNEMB_EINVAL,
                          "table '%s': optimizer %s = %g is invalid; it must "
                          "be %s",
                          table, field, value, rule);
}

int dynemb_optim_validate(const dynemb_optimizer *o, const char *table) {
  if (dynemb_optim_slot_count(o->kind) < 0)
    return dynemb_error_set(DYNEMB_EINVAL,
                            "table '%s': unknown optimizer kind %d; use "
                            "DYNEMB_OPT_SGD, _ADAGRAD, _ADAM, _FTRL or _ADAMW",
                            table, o->kind);
  if (!(o->learning_rate >= 0.0f) || isinf(o->learning_rate))
    return bad(table, "learning_rate", o->learning_rate, "finite and >= 0");
  switch (o->kind) {
  case DYNEMB_OPT_ADAGRAD:
    if (!(o->initial_accumulator_value > 0.0f) ||
        isinf(o->initial_accumulator_value))
      return bad(table, "initial_accumulator_value",
                 o->initial_accumulator_value,
                 "finite and > 0 (TensorFlow's Adagrad requires it)");
    break;
  case DYNEMB_OPT_ADAMW:
    if (!(o->weight_decay >= 0.0f) || isinf(o->weight_decay))
      return bad(table, "weight_decay", o->weight_decay, "finite and >= 0");
    /* AdamW's Adam part has Adam's rules: */
    /* fall through */
  case DYNEMB_OPT_ADAM:
    if (!(o->beta1 >= 0.0f && o->beta1 < 1.0f))
      return bad(table, "beta1", o->beta1, "in [0, 1)");
    if (!(o->beta2 >= 0.0f && o->beta2 < 1.0f))
      return bad(table, "beta2", o->beta2, "in [0, 1)");
    if (!(o->epsilon > 0.0f) || isinf(o->epsilon))
      return bad(table, "epsilon", o->epsilon, "finite and > 0");
    break;
  case DYNEMB_OPT_FTRL:
    if (!(o->initial_accumulator_value >= 0.0f) ||
        isinf(o->initial_accumulator_value))
      return bad(table, "initial_accumulator_value",
                 o->initial_accumulator_value, "finite and >= 0");
    if (!(o->learning_rate_power <= 0.0f) || isinf(o->learning_rate_power))
      return bad(table, "learning_rate_power", o->learning_rate_power,
                 "finite and <= 0 (TensorFlow's default is -0.5)");
    if (!(o->l1 >= 0.0f) || isinf(o->l1))
      return bad(table, "l1_regularization_strength", o->l1,
                 "finite and >= 0");
    if (!(o->l2 >= 0.0f) || isinf(o->l2))
      return bad(table, "l2_regularization_strength", o->l2,
                 "finite and >= 0");
    if (!(o->l2_shrinkage >= 0.0f) || isinf(o->l2_shrinkage))
      return bad(table, "l2_shrinkage_regularization_strength",
                 o->l2_shrinkage, "finite and >= 0");
    break;
  default:
    break;
  }
  return DYNEMB_OK;
}

void dynemb_optim_init_slots(const dynemb_optimizer *o, float *slots,
                             int dim) {
  switch (o->kind) {
  case DYNEMB_OPT_ADAGRAD:
    for (int i = 0; i < dim; i++) slots[i] = o->initial_accumulator_value;
    break;
  case DYNEMB_OPT_ADAM:
  case DYNEMB_OPT_ADAMW:
    for (int i = 0; i < 2 * dim; i++) slots[i] = 0.0f;
    break;
  case DYNEMB_OPT_FTRL:
    for (int i = 0; i < dim; i++) slots[i] = o->initial_accumulator_value;
    for (int i = dim; i < 2 * dim; i++) slots[i] = 0.0f;
    break;
  default:
    break;
  }
}

/* The per-row loops below take restrict pointers and a prepared step, and
 * the engine is built with -fno-math-errno, so that sqrtf is one
 * instruction and the compiler vectorizes them. They are always inlined
 * into dynemb_optim_apply_row, so that each of its clones (optim.h) holds
 * a copy of every loop built for its instruction set. Vectorizing does not
 * reassociate or fuse anything (no -ffast-math, and -std=c11 turns FP
 * contraction off), so every element gets exactly the scalar result. */
#define ROW_LOOP static inline __attribute__((always_inline))

ROW_LOOP void apply_sgd(float *restrict var, const float *restrict g, int dim,
                        float lr) {
  for (int i = 0; i < dim; i++) var[i] -= lr * g[i];
}

/* ApplyAdagrad (update_slots): accum += g^2; var -= lr * g / sqrt(accum). */
ROW_LOOP void apply_adagrad(float *restrict var, float *restrict accum,
                            const float *restrict g, int dim, float lr) {
  for (int i = 0; i < dim; i++) {
    float a = accum[i] + g[i] * g[i];
    accum[i] = a;
    var[i] -= lr * g[i] / sqrtf(a);
  }
}

/* Adam's moments of element i and its step, with the bias correction
 * folded into the step size as TF's ApplyAdam does (alpha is prepared once
 * per step, see dynemb_optim_prepare). Shared by Adam and AdamW; inlined,
 * so the callers' loops still vectorize. */
ROW_LOOP float adam_step(const dynemb_optim_step *s, float *restrict m,
                         float *restrict v, float gi, int i) {
  float mi = m[i] + (gi - m[i]) * s->one_minus_b1;
  float vi = v[i] + (gi * gi - v[i]) * s->one_minus_b2;
  m[i] = mi;
  v[i] = vi;
  return (mi * s->alpha) / (sqrtf(vi) + s->epsilon);
}

ROW_LOOP void apply_adam(const dynemb_optim_step *s, float *restrict var,
                         float *restrict m, float *restrict v,
                         const float *restrict g, int dim) {
  for (int i = 0; i < dim; i++) var[i] -= adam_step(s, m, v, g[i], i);
}

/* AdamW: the decay uses the row's value before this step (the paper's
 * theta_{t-1}), then the same Adam step. Written as two subtractions in
 * this order, as Keras' AdamW does them, so a reference that decays first
 * and then steps gets the same floats. */
ROW_LOOP void apply_adamw(const dynemb_optim_step *s, float *restrict var,
                          float *restrict m, float *restrict v,
                          const float *restrict g, int dim) {
  const float decay = s->decay;
  for (int i = 0; i < dim; i++) {
    float w = var[i] - var[i] * decay;
    var[i] = w - adam_step(s, m, v, g[i], i);
  }
}

/* ApplyFtrlV2 (l2_shrinkage; with l2_shrinkage = 0 it equals ApplyFtrl). */
ROW_LOOP void apply_ftrl(const dynemb_optim_step *s, float *restrict var,
                         float *restrict accum, float *restrict linear,
                         const float *restrict g, int dim) {
  const float p = s->lr_power, lr = s->lr, l1 = s->l1, l2 = s->l2,
              l2s = s->l2_shrinkage;
  const int is_sqrt = (p == -0.5f);
  for (int i = 0; i < dim; i++) {
    float g_shrink = g[i] + 2.0f * l2s * var[i];
    float new_accum = accum[i] + g[i] * g[i];
    float new_pow = is_sqrt ? sqrtf(new_accum) : powf(new_accum, -p);
    float old_pow = is_sqrt ? sqrtf(accum[i]) : powf(accum[i], -p);
    linear[i] += g_shrink - (new_pow - old_pow) / lr * var[i];
    float quadratic = new_pow / lr + 2.0f * l2;
    if (fabsf(linear[i]) > l1) {
      float sign = linear[i] > 0.0f ? 1.0f : (linear[i] < 0.0f ? -1.0f : 0.0f);
      var[i] = (sign * l1 - linear[i]) / quadratic;
    } else {
      var[i] = 0.0f;
    }
    accum[i] = new_accum;
  }
}

void dynemb_optim_prepare(const dynemb_optimizer *o, float lr, uint64_t step,
                          dynemb_optim_step *s) {
  s->kind = o->kind;
  s->lr = lr;
  s->alpha = lr;
  s->one_minus_b1 = 1.0f - o->beta1;
  s->one_minus_b2 = 1.0f - o->beta2;
  s->epsilon = o->epsilon;
  s->lr_power = o->learning_rate_power;
  s->l1 = o->l1;
  s->l2 = o->l2;
  s->l2_shrinkage = o->l2_shrinkage;
  s->decay = lr * o->weight_decay;
  if (o->kind == DYNEMB_OPT_ADAM || o->kind == DYNEMB_OPT_ADAMW) {
    /* alpha = lr * sqrt(1 - beta2^t) / (1 - beta1^t), TF's ApplyAdam */
    double t = (double)(step ? step : 1);
    float beta1_power = (float)pow((double)o->beta1, t);
    float beta2_power = (float)pow((double)o->beta2, t);
    s->alpha = lr * sqrtf(1.0f - beta2_power) / (1.0f - beta1_power);
  }
}

DYNEMB_VECTOR_CLONES
void dynemb_optim_apply_row(const dynemb_optim_step *s, float *restrict var,
                            float *restrict slots, const float *restrict grad,
                            int dim) {
  switch (s->kind) {
  case DYNEMB_OPT_SGD: apply_sgd(var, grad, dim, s->lr); break;
  case DYNEMB_OPT_ADAGRAD: apply_adagrad(var, slots, grad, dim, s->lr); break;
  case DYNEMB_OPT_ADAM:
    apply_adam(s, var, slots, slots + dim, grad, dim);
    break;
  case DYNEMB_OPT_FTRL:
    apply_ftrl(s, var, slots, slots + dim, grad, dim);
    break;
  case DYNEMB_OPT_ADAMW:
    apply_adamw(s, var, slots, slots + dim, grad, dim);
    break;
  default: break;
  }
}

void dynemb_optim_apply(const dynemb_optimizer *o, float *row,
                        const float *grad, int dim, float lr, uint64_t step) {
  dynemb_optim_step s;
  dynemb_optim_prepare(o, lr, step, &s);
  dynemb_optim_apply_row(&s, row, row + dim, grad, dim);
}
