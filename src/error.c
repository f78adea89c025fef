/*
 * error.c -- error codes to sentences, and the per-thread last-error message.
 *
 * A thread-local buffer keeps the message of the last failure on each
 * thread, so concurrent TensorFlow kernels never see each other's errors.
 */
#include "error.h"

#include <stdarg.h>
#include <stdio.h>

static _Thread_local char last_error[1024];

int dynemb_error_set(int code, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(last_error, sizeof last_error, fmt, ap);
  va_end(ap);
  return code;
}

void dynemb_error_clear(void) { last_error[0] = '\0'; }

const char *dynemb_last_error(void) { return last_error; }

const char *dynemb_strerror(int code) {
  switch (code) {
  case DYNEMB_OK: return "success";
  case DYNEMB_EINVAL: return "invalid argument";
  case DYNEMB_ENOMEM: return "out of memory";
  case DYNEMB_EEXIST: return "a table with this name already exists";
  case DYNEMB_ENOTFOUND: return "no such table";
  case DYNEMB_EDIM: return "dimension mismatch";
  case DYNEMB_ENONFINITE: return "NaN or Inf in gradients";
  case DYNEMB_EIO: return "I/O error";
  case DYNEMB_ECORRUPT: return "checkpoint data is corrupt";
  case DYNEMB_EVERSION: return "unsupported checkpoint format version";
  case DYNEMB_ECAPACITY: return "capacity budget exhausted";
  case DYNEMB_EMISMATCH: return "checkpoint layout differs from the table";
  default: return "unknown dynemb error code";
  }
}
