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

/* Checks a shape argument (ndim in range, dims >= 0, numel * elem fits); sets *numel. */
int loom__check_shape(const char *who, loom_dtype dt, int ndim, const int64_t *shape,
                      size_t *numel);

/* "[2, 3, 4]" into buf. */
const char *loom__shape_str(int ndim, const int64_t *shape, char *buf, size_t cap);

#endif
