/*
 * init.h -- initial row values as a pure function of (seed, key, element).
 *
 * A counter-based generator (hash of seed, key and element index) makes the
 * initial value of a row independent of threads, batch order, sharding and
 * insertion order: a key evicted and seen again gets the same initial value,
 * and two workers agree without talking.
 */
#ifndef DYNEMB_INIT_H
#define DYNEMB_INIT_H

#include <stdint.h>

#include "dynemb.h"

/* Checks an initializer; on error names `table_name` and the field. */
int dynemb_init_validate(const dynemb_initializer *init,
                         const char *table_name);

/* Writes the `dim` initial embedding values of `key` into `out`. */
void dynemb_init_row(const dynemb_initializer *init, int64_t key, float *out,
                     int dim);

#endif
