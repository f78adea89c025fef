/*
 * optim.h -- sparse optimizer math on one row (internal).
 *
 * A row is `dim` embedding floats followed by the optimizer's slots, each
 * `dim` floats (see row layout in table.c). These functions know only the
 * math: they update one row given the summed gradient of that row, exactly
 * as TensorFlow's kernels do (ApplyGradientDescent, ApplyAdagrad,
 * Adam with beta powers, ApplyFtrlV2), so dynemb tables train to the same
 * numbers as dense tf.Variable tables.
 */
#ifndef DYNEMB_OPTIM_H
#define DYNEMB_OPTIM_H

#include <stdint.h>

#include "dynemb.h"

/* Number of `dim`-wide slots the optimizer keeps per row, or -1 for an
 * unknown kind. SGD 0, ADAGRAD 1, ADAM 2 (m, v), FTRL 2 (accum, linear). */
int dynemb_optim_slot_count(int kind);

/* Human name ("sgd", "adagrad", "adam", "ftrl"), or "unknown". */
const char *dynemb_optim_name(int kind);

/* Checks hyper-parameters; on error calls dynemb_error_set naming table
 * `table_name` and the field, and returns the code. */
int dynemb_optim_validate(const dynemb_optimizer *o, const char *table_name);

/* Writes the initial slot values of a new row (slots = row + dim). */
void dynemb_optim_init_slots(const dynemb_optimizer *o, float *slots, int dim);

/* Updates one row with gradient `grad` (dim floats). `lr` is the learning
 * rate for this step; `step` is the 1-based optimizer step (Adam's bias
 * correction uses beta^step). */
void dynemb_optim_apply(const dynemb_optimizer *o, float *row,
                        const float *grad, int dim, float lr, uint64_t step);

#endif
