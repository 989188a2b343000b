/* tensor_int.h: the tensor and storage structs, for the layers that build on tensors (ops,
 * autograd). Users see only the opaque handle in loom/tensor.h. */
#ifndef LOOM_TENSOR_INT_H
#define LOOM_TENSOR_INT_H

#include "core/core_int.h"
#include "loom/tensor.h"

#include <stdatomic.h>

#define LOOM__TENSOR_MAGIC 0x54454e53u /* "TENS" */
#define LOOM__TENSOR_DEAD 0xdeadbeefu

typedef struct loom__storage {
  _Atomic int refcount;
  void *data;
  size_t nbytes;
  loom_pool pool;
  bool owned; /* false for a wrapped user buffer */
} loom__storage;

struct loom_tensor {
  uint32_t magic;
  _Atomic int refcount;
  loom_dtype dtype;
  int ndim;
  int64_t shape[LOOM_MAX_DIMS];
  int64_t strides[LOOM_MAX_DIMS]; /* elements */
  size_t offset;                  /* elements from the storage base */
  loom__storage *storage;
  void *autograd; /* owned by the autograd layer, released through loom__tensor_autograd_release */
};

/* Set by the autograd layer: releases t->autograd when t is freed (the hook by which core
 * calls up without including autograd). */
extern void (*loom__tensor_autograd_release)(loom_tensor *t);

/* A new tensor header viewing `base`'s storage with the given geometry (retains storage). */
int loom__tensor_view(const loom_tensor *base, int ndim, const int64_t *shape,
                      const int64_t *strides, size_t offset, loom_tensor **out);

/* Calls fn(element_offset, ctx) for every element of a strided geometry in row-major order. */
void loom__for_each_offset(int ndim, const int64_t *shape, const int64_t *strides, size_t offset,
                           void (*fn)(size_t off, void *ctx), void *ctx);

/* Re-point t (a contiguous tensor; shape kept) at element `offset` of base's storage, with
 * base's dtype, or, with base NULL, at no storage at all ("released": loom_tensor_data is
 * NULL and every op and loom_tensor_check refuse it with LOOM_EMISUSE). The old storage is
 * released. FSDP uses this to point a module's parameters at a gathered unit and back, so
 * that everything holding the parameter (the module, the tape) sees the current values. */
void loom__tensor_rebind(loom_tensor *t, const loom_tensor *base, size_t offset, loom_dtype dt);
/* loom_tensor_check, and LOOM_EMISUSE for a released tensor: what reads or writes data calls. */
int loom__tensor_check_data(const loom_tensor *t, const char *who);
/* True when t holds no storage (see loom__tensor_rebind). */
bool loom__tensor_released(const loom_tensor *t);
/* A new contiguous tensor of this shape and dtype with no storage (released, as above): the
 * parameters of a module built with deferred initialisation (loom/nn.h), which cost only their
 * header until they are given memory. */
int loom__tensor_shell(loom_dtype dt, int ndim, const int64_t *shape, loom_tensor **out);
/* loom_tensor_zeros for zeros nothing writes before a training step (a gradient arena): a dry
 * run counts them as not resident until then (loom__calloc_untouched). */
int loom__tensor_zeros_untouched(loom_dtype dt, int ndim, const int64_t *shape,
                                 loom_tensor **out);

/* Checks a shape argument (ndim in range, dims >= 0, numel * elem fits); sets *numel. */
int loom__check_shape(const char *who, loom_dtype dt, int ndim, const int64_t *shape,
                      size_t *numel);

/* "[2, 3, 4]" into buf. */
const char *loom__shape_str(int ndim, const int64_t *shape, char *buf, size_t cap);

#endif
