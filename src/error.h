/*
 * error.h -- the engine's single error-reporting path.
 *
 * Every failing public call records a sentence in a thread-local buffer via
 * dynemb_error_set() and returns the code, so callers (the TensorFlow glue,
 * the CLI) can show a message that names the table and the fix.
 */
#ifndef DYNEMB_ERROR_H
#define DYNEMB_ERROR_H

#include "dynemb.h"

/* Formats the thread's last-error message and returns `code`, so that a
 * failure reads: return dynemb_error_set(DYNEMB_EINVAL, "table '%s': ...").
 */
int dynemb_error_set(int code, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

/* Clears the thread's message (called at the start of public calls that
 * can fail, so a stale message never describes a later success). */
void dynemb_error_clear(void);

#endif
