/*
 * optim.h -- sparse optimizer math on one row (internal).
 *
 * A row is `dim` embedding floats plus the optimizer's slots, each `dim`
 * floats (the table stores them apart, see table.c). These know only the
 * math: they update one row given the summed gradient of that row, exactly
 * as TensorFlow's kernels do (ApplyGradientDescent, ApplyAdagrad,
 * Adam with beta powers, ApplyFtrlV2; AdamW as Keras' AdamW), so dynemb
 * tables train to the same numbers as dense tf.Variable tables.
 */
#ifndef DYNEMB_OPTIM_H
#define DYNEMB_OPTIM_H

#include <stdint.h>

#include "dynemb.h"

/* Function multiversioning for the per-row math loops: the compiler emits
 * one copy per instruction set (AVX-512, AVX2, the build's baseline) and
 * the loader picks the widest the CPU has. The loops are bound by their
 * square roots and divisions, so the width counts: portable builds target
 * baseline x86-64 (SSE2, 4 floats per instruction), and on the 2-vCPU AMD
 * EPYC VM measured (4M x 64, Adam) the clones applied 25-30% more keys per
 * second and ran the flat Adam limit ~2x (docs/benchmark-journal.md).
 * Results are the same bits in every copy:
 * -std=c11 turns FP contraction off (no FMA), and sqrt and division are
 * correctly rounded at every width. GCC only (clang 14 wants the attribute
 * on every declaration, which GCC then resolves in each caller); build
 * with -DDYNEMB_NO_CLONES to get one copy. Used on the definition only.
 * Not under ThreadSanitizer: the loader runs the clone resolver before the
 * TSan runtime starts, and the instrumented resolver crashes. */
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && \
    defined(__has_attribute) && !defined(DYNEMB_NO_CLONES) &&           \
    !defined(__SANITIZE_THREAD__)
#if __has_attribute(target_clones)
#define DYNEMB_VECTOR_CLONES \
  __attribute__((target_clones("avx512f", "avx2", "default")))
#endif
#endif
#ifndef DYNEMB_VECTOR_CLONES
#define DYNEMB_VECTOR_CLONES
#endif

/* Number of `dim`-wide slots the optimizer keeps per row, or -1 for an
 * unknown kind. SGD 0, ADAGRAD 1, ADAM 2 (m, v), FTRL 2 (accum, linear),
 * ADAMW 2 (m, v). */
int dynemb_optim_slot_count(int kind);

/* Checks hyper-parameters; on error calls dynemb_error_set naming table
 * `table_name` and the field, and returns the code. */
int dynemb_optim_validate(const dynemb_optimizer *o, const char *table_name);

/* Writes the initial slot values of a new row (slots = row + dim). */
void dynemb_optim_init_slots(const dynemb_optimizer *o, float *slots, int dim);

/* Everything about one optimizer step that does not depend on the row:
 * computed once per apply call (dynemb_optim_prepare), so that the per-row
 * loop does no pow() and no per-row scalar setup. The float values are
 * computed exactly as the per-row code used to, so results do not change. */
typedef struct dynemb_optim_step {
  int kind;
  float lr;
  float alpha;        /* ADAM: lr * sqrt(1 - beta2^t) / (1 - beta1^t) */
  float one_minus_b1; /* ADAM: 1 - beta1 */
  float one_minus_b2; /* ADAM: 1 - beta2 */
  float epsilon;      /* ADAM */
  float lr_power;     /* FTRL: learning_rate_power (<= 0) */
  float l1, l2, l2_shrinkage; /* FTRL */
  float decay;        /* ADAMW: lr * weight_decay */
} dynemb_optim_step;

/* Fills *s for one step: `lr` is the learning rate for this step; `step`
 * is the 1-based optimizer step (Adam's bias correction uses beta^step). */
void dynemb_optim_prepare(const dynemb_optimizer *o, float lr, uint64_t step,
                          dynemb_optim_step *s);

/* Updates one row: `var` (dim embedding floats) and its optimizer slots
 * `slots` (slot_count * dim floats, in the layout above), with gradient
 * `grad`. The three ranges must not overlap (they are restrict, so the
 * loops vectorize). */
void dynemb_optim_apply_row(const dynemb_optim_step *s, float *restrict var,
                            float *restrict slots, const float *restrict grad,
                            int dim);

/* Updates one row laid out as `dim` embedding floats followed by the slots
 * (prepare + apply_row; for tests and one-off callers). */
void dynemb_optim_apply(const dynemb_optimizer *o, float *row,
                        const float *grad, int dim, float lr, uint64_t step);

#endif
