/*
 * kernel_util.h -- what the two op libraries' kernels share: TensorFlow's C
 * headers (in the order C needs them), engine and TensorFlow error codes,
 * failing a kernel with a sentence, fetching inputs by name, allocating
 * outputs and registering an op with its CPU kernel.
 *
 * Each op library is ONE translation unit that includes TensorFlow headers
 * (kernels.h defines `const size_t TF_InputRange_Args_STRUCT_SIZE` at file
 * scope, so two such files in one library fail to link), so everything here
 * is static inline: tf/dynemb_ops.c (the engine's ops) and tf/sharded_ops.c
 * (the ops of several ranks, linked with the exchange) each include it once.
 */
#ifndef DYNEMB_KERNEL_UTIL_H
#define DYNEMB_KERNEL_UTIL_H

#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tensorflow/c/kernels.h"
/* ops.h forward-declares its handle types as `struct X;` without typedefs
 * (valid only in C++), then uses the bare names: C needs the typedefs
 * first. */
typedef struct TF_DimensionHandle TF_DimensionHandle;
typedef struct TF_OpDefinitionBuilder TF_OpDefinitionBuilder;
typedef struct TF_ShapeHandle TF_ShapeHandle;
typedef struct TF_ShapeInferenceContext TF_ShapeInferenceContext;
#include "tensorflow/c/ops.h"
#include "tensorflow/c/tf_datatype.h"
#include "tensorflow/c/tf_status.h"
#include "tensorflow/c/tf_tensor.h"

#include "dynemb.h"

static inline TF_Code code_of(int rc) {
  switch (rc) {
  case DYNEMB_EINVAL: return TF_INVALID_ARGUMENT;
  case DYNEMB_ENOMEM: return TF_RESOURCE_EXHAUSTED;
  case DYNEMB_EEXIST: return TF_ALREADY_EXISTS;
  case DYNEMB_ENOTFOUND: return TF_NOT_FOUND;
  case DYNEMB_EDIM: return TF_INVALID_ARGUMENT;
  case DYNEMB_ENONFINITE: return TF_INVALID_ARGUMENT;
  case DYNEMB_EIO: return TF_UNAVAILABLE;
  case DYNEMB_ECORRUPT: return TF_DATA_LOSS;
  case DYNEMB_EVERSION: return TF_FAILED_PRECONDITION;
  case DYNEMB_ECAPACITY: return TF_RESOURCE_EXHAUSTED;
  case DYNEMB_EMISMATCH: return TF_FAILED_PRECONDITION;
  default: return TF_INTERNAL;
  }
}

/* Fails the kernel with a message; `code` TF_OK is never passed. */
static inline void fail(TF_OpKernelContext *ctx, TF_Code code, const char *fmt,
                        ...) __attribute__((format(printf, 3, 4)));

static inline void fail(TF_OpKernelContext *ctx, TF_Code code, const char *fmt,
                        ...) {
  char msg[1280];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  TF_Status *st = TF_NewStatus();
  TF_SetStatus(st, code, msg);
  TF_OpKernelContext_Failure(ctx, st);
  TF_DeleteStatus(st);
}

/* Fails the kernel with the engine's last error for return code `rc`. */
static inline void fail_engine(TF_OpKernelContext *ctx, int rc,
                               const char *op) {
  const char *m = dynemb_last_error();
  fail(ctx, code_of(rc), "dynemb %s: %s", op,
       (m && *m) ? m : dynemb_strerror(rc));
}

static inline char *get_string_attr(TF_OpKernelConstruction *c,
                                    const char *attr, TF_Status *st) {
  int32_t list_size = 0, total = 0;
  TF_OpKernelConstruction_GetAttrSize(c, attr, &list_size, &total, st);
  if (TF_GetCode(st) != TF_OK)
    return NULL;
  if (total < 0)
    total = 0;
  char *s = calloc((size_t)total + 1, 1);
  if (!s) {
    TF_SetStatus(st, TF_RESOURCE_EXHAUSTED, "dynemb: out of memory");
    return NULL;
  }
  TF_OpKernelConstruction_GetAttrString(c, attr, s, (size_t)total, st);
  if (TF_GetCode(st) != TF_OK) {
    free(s);
    return NULL;
  }
  return s;
}

/* Fetches the input called `name` (a single tensor, not a list); on
 * failure fails the kernel and returns NULL. */
static inline TF_Tensor *input(TF_OpKernelContext *ctx, const char *name) {
  TF_Status *st = TF_NewStatus();
  TF_Tensor *t = NULL;
  TF_InputRange_Args r = {.struct_size = TF_InputRange_Args_STRUCT_SIZE,
                          .priv = NULL,
                          .status = st};
  TF_InputRange(ctx, name, &r);
  if (TF_GetCode(st) == TF_OK && r.stop != r.start + 1)
    TF_SetStatus(st, TF_INTERNAL,
                 "dynemb: an op input is a list, not one "
                 "tensor; the op library and its op definitions disagree");
  if (TF_GetCode(st) == TF_OK)
    TF_GetInput(ctx, r.start, &t, st);
  if (TF_GetCode(st) != TF_OK) {
    TF_OpKernelContext_Failure(ctx, st);
    t = NULL;
  }
  TF_DeleteStatus(st);
  return t;
}

/* Allocates output i; on failure fails the kernel and returns NULL. */
static inline TF_Tensor *output(TF_OpKernelContext *ctx, int i, TF_DataType dt,
                                const int64_t *dims, int nd, size_t elem_size) {
  size_t n = 1;
  for (int d = 0; d < nd; d++)
    n *= (size_t)dims[d];
  TF_Status *st = TF_NewStatus();
  TF_Tensor *t = TF_AllocateOutput(ctx, i, dt, dims, nd, n * elem_size, st);
  if (TF_GetCode(st) != TF_OK) {
    TF_OpKernelContext_Failure(ctx, st);
    if (t)
      TF_DeleteTensor(t);
    t = NULL;
  }
  TF_DeleteStatus(st);
  return t;
}

static inline int scalar_i64(TF_OpKernelContext *ctx, TF_Tensor *t,
                             const char *op, const char *what, int64_t *out) {
  if (TF_TensorType(t) != TF_INT64 || TF_TensorElementCount(t) != 1) {
    fail(ctx, TF_INVALID_ARGUMENT, "dynemb %s: '%s' must be an int64 scalar",
         op, what);
    return -1;
  }
  *out = *(const int64_t *)TF_TensorData(t);
  return 0;
}

static inline int set_scalar_output(TF_OpKernelContext *ctx, int i, int64_t v) {
  TF_Tensor *o = output(ctx, i, TF_INT64, NULL, 0, sizeof(int64_t));
  if (!o)
    return -1;
  *(int64_t *)TF_TensorData(o) = v;
  TF_DeleteTensor(o);
  return 0;
}

/* The ids of `ids` (n > 0 elements) as int64: the tensor's own data, or
 * int32 ids widened into *wide (malloc'ed; the caller frees it). NULL after
 * failing the kernel (wrong dtype, out of memory). */
static inline const int64_t *ids_as_int64(TF_OpKernelContext *ctx,
                                          const char *table_name,
                                          TF_Tensor *ids, int64_t n,
                                          const char *op, int64_t **wide) {
  if (TF_TensorType(ids) == TF_INT64)
    return TF_TensorData(ids);
  if (TF_TensorType(ids) != TF_INT32) {
    fail(ctx, TF_INVALID_ARGUMENT,
         "dynemb %s: table '%s': ids must be "
         "int32 or int64; cast them with tf.cast(ids, tf.int64)",
         op, table_name);
    return NULL;
  }
  *wide = malloc((size_t)n * sizeof **wide);
  if (!*wide) {
    fail(ctx, TF_RESOURCE_EXHAUSTED,
         "dynemb %s: table '%s': out of memory "
         "widening %lld int32 ids",
         op, table_name, (long long)n);
    return NULL;
  }
  dynemb_widen_keys(TF_TensorData(ids), (size_t)n, *wide);
  return *wide;
}

static inline void unknown_shape(TF_ShapeInferenceContext *ctx, TF_Status *st) {
  TF_ShapeInferenceContextSetUnknownShape(ctx, st);
}

/* Registration failures cannot be reported through tf.load_op_library, so
 * they go to stderr; the op is then missing and Python says so. */
static inline void check(TF_Status *st, const char *what, const char *name) {
  if (TF_GetCode(st) != TF_OK)
    fprintf(stderr, "dynemb: registering %s %s failed: %s\n", what, name,
            TF_Message(st));
}

static inline void register_op_kernel(
    const char *name, const char *const *attrs, const char *const *inputs,
    const char *const *outputs, void *(*create)(TF_OpKernelConstruction *),
    void (*compute)(void *, TF_OpKernelContext *), void (*destroy)(void *)) {
  TF_Status *st = TF_NewStatus();
  TF_OpDefinitionBuilder *b = TF_NewOpDefinitionBuilder(name);
  for (; attrs && *attrs; attrs++)
    TF_OpDefinitionBuilderAddAttr(b, *attrs);
  for (; inputs && *inputs; inputs++)
    TF_OpDefinitionBuilderAddInput(b, *inputs);
  for (; outputs && *outputs; outputs++)
    TF_OpDefinitionBuilderAddOutput(b, *outputs);
  TF_OpDefinitionBuilderSetIsStateful(b, true);
  TF_OpDefinitionBuilderSetShapeInferenceFunction(b, unknown_shape);
  TF_RegisterOpDefinition(b, st); /* takes ownership of b */
  check(st, "op", name);
  if (TF_GetCode(st) == TF_OK) {
    TF_KernelBuilder *kb =
        TF_NewKernelBuilder(name, "CPU", create, compute, destroy);
    TF_RegisterKernelBuilder(name, kb, st); /* takes ownership of kb */
    check(st, "kernel", name);
  }
  TF_DeleteStatus(st);
}

#define LIST(...) ((const char *const[]){__VA_ARGS__, NULL})

#endif
