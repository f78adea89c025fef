/*
 * optim.c -- sparse optimizer math on one row, with TensorFlow's formulas.
 *
 * The table sums the gradients of repeated keys and then calls
 * dynemb_optim_apply once per row, so a dynemb table trained with these
 * functions follows the same trajectory as a dense tf.Variable trained with
 * tf.compat.v1's GradientDescent / Adagrad / Adam / Ftrl optimizers (Adam is
 * "lazy": rows absent from a batch keep their moments, as in TF-Addons'
 * LazyAdam; on batches where every row appears it equals dense Adam).
 *
 * Slot layout after the `dim` embedding floats:
 *   ADAGRAD: accum[dim]          ADAM: m[dim], v[dim]
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
  default: return -1;
  }
}

const char *dynemb_optim_name(int kind) {
  switch (kind) {
  case DYNEMB_OPT_SGD: return "sgd";
  case DYNEMB_OPT_ADAGRAD: return "adagrad";
  case DYNEMB_OPT_ADAM: return "adam";
  case DYNEMB_OPT_FTRL: return "ftrl";
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
                            "DYNEMB_OPT_SGD, _ADAGRAD, _ADAM or _FTRL",
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

static void apply_sgd(float *var, const float *g, int dim, float lr) {
  for (int i = 0; i < dim; i++) var[i] -= lr * g[i];
}

/* ApplyAdagrad (update_slots): accum += g^2; var -= lr * g / sqrt(accum). */
static void apply_adagrad(float *var, const float *g, int dim, float lr) {
  float *accum = var + dim;
  for (int i = 0; i < dim; i++) {
    accum[i] += g[i] * g[i];
    var[i] -= lr * g[i] / sqrtf(accum[i]);
  }
}

/* Adam with bias correction folded into the step size, as TF's ApplyAdam:
 * alpha = lr * sqrt(1 - beta2^t) / (1 - beta1^t). */
static void apply_adam(const dynemb_optimizer *o, float *var, const float *g,
                       int dim, float lr, uint64_t step) {
  float *m = var + dim, *v = var + 2 * dim;
  double t = (double)(step ? step : 1);
  float beta1_power = (float)pow((double)o->beta1, t);
  float beta2_power = (float)pow((double)o->beta2, t);
  float alpha = lr * sqrtf(1.0f - beta2_power) / (1.0f - beta1_power);
  float one_minus_b1 = 1.0f - o->beta1, one_minus_b2 = 1.0f - o->beta2;
  for (int i = 0; i < dim; i++) {
    m[i] += (g[i] - m[i]) * one_minus_b1;
    v[i] += (g[i] * g[i] - v[i]) * one_minus_b2;
    var[i] -= (m[i] * alpha) / (sqrtf(v[i]) + o->epsilon);
  }
}

/* ApplyFtrlV2 (l2_shrinkage; with l2_shrinkage = 0 it equals ApplyFtrl). */
static void apply_ftrl(const dynemb_optimizer *o, float *var, const float *g,
                       int dim, float lr) {
  float *accum = var + dim, *linear = var + 2 * dim;
  const float p = o->learning_rate_power;
  const int is_sqrt = (p == -0.5f);
  for (int i = 0; i < dim; i++) {
    float g_shrink = g[i] + 2.0f * o->l2_shrinkage * var[i];
    float new_accum = accum[i] + g[i] * g[i];
    float new_pow = is_sqrt ? sqrtf(new_accum) : powf(new_accum, -p);
    float old_pow = is_sqrt ? sqrtf(accum[i]) : powf(accum[i], -p);
    linear[i] += g_shrink - (new_pow - old_pow) / lr * var[i];
    float quadratic = new_pow / lr + 2.0f * o->l2;
    if (fabsf(linear[i]) > o->l1) {
      float sign = linear[i] > 0.0f ? 1.0f : (linear[i] < 0.0f ? -1.0f : 0.0f);
      var[i] = (sign * o->l1 - linear[i]) / quadratic;
    } else {
      var[i] = 0.0f;
    }
    accum[i] = new_accum;
  }
}

void dynemb_optim_apply(const dynemb_optimizer *o, float *row,
                        const float *grad, int dim, float lr, uint64_t step) {
  switch (o->kind) {
  case DYNEMB_OPT_SGD: apply_sgd(row, grad, dim, lr); break;
  case DYNEMB_OPT_ADAGRAD: apply_adagrad(row, grad, dim, lr); break;
  case DYNEMB_OPT_ADAM: apply_adam(o, row, grad, dim, lr, step); break;
  case DYNEMB_OPT_FTRL: apply_ftrl(o, row, grad, dim, lr); break;
  default: break;
  }
}
