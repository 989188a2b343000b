/* loom/tensor.h: tensors, their storage and views.
 *
 * A tensor is a dtype, a shape of up to LOOM_MAX_DIMS dimensions and element strides over a
 * storage buffer. New tensors are contiguous row-major; views (reshape, permute, transpose,
 * narrow, slice) share the storage of the tensor they come from and may be strided.
 *
 * Ownership: tensors are reference-counted. Every function that gives back a tensor through
 * `out` gives a new reference the caller owns and releases with loom_tensor_free. A view
 * keeps its storage alive, so freeing the base before the view is fine. loom_tensor_free(NULL)
 * is a no-op. Getters return borrowed values.
 *
 * Errors: every fallible call returns a status with a message naming the function and the
 * problem (NULL argument, rank out of range, negative or overflowing size, dtype mismatch, a
 * freed tensor where it can be detected: LOOM_EMISUSE). On failure *out is NULL.
 *
 * Threads: a tensor may be read by many threads at once; writes need the caller's locking.
 * Reference counts are atomic. */
#ifndef LOOM_TENSOR_H
#define LOOM_TENSOR_H

#include "loom/alloc.h"
#include "loom/dtype.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#ifdef __cplusplus
extern "C" {
#endif

#define LOOM_MAX_DIMS 8

typedef struct loom_tensor loom_tensor;

/* ---- creation ------------------------------------------------------------------------- */

/* A new contiguous tensor, uninitialised, in the compute pool. ndim may be 0 (a scalar);
 * every dim must be >= 0. */
int loom_tensor_empty(loom_dtype dt, int ndim, const int64_t *shape, loom_tensor **out);
/* The same, filled with zeros. */
int loom_tensor_zeros(loom_dtype dt, int ndim, const int64_t *shape, loom_tensor **out);
/* The same, uninitialised, counted against `pool` (host tensors for offload). */
int loom_tensor_empty_pool(loom_pool pool, loom_dtype dt, int ndim, const int64_t *shape,
                           loom_tensor **out);
/* A tensor over the caller's buffer, not copied: the caller keeps `data` alive and valid for
 * numel * dtype-size bytes for as long as the tensor (or a view of it) lives. */
int loom_tensor_wrap(loom_dtype dt, int ndim, const int64_t *shape, void *data,
                     loom_tensor **out);
/* A new tensor holding a copy of the caller's contiguous buffer. */
int loom_tensor_from_data(loom_dtype dt, int ndim, const int64_t *shape, const void *data,
                          loom_tensor **out);
/* A new reference to the same tensor (returns t). NULL-safe. */
loom_tensor *loom_tensor_retain(loom_tensor *t);
/* Release a reference; the last one frees the tensor (and its storage, if no view holds it). */
void loom_tensor_free(loom_tensor *t);

/* ---- properties (borrowed; t must be a live tensor) ----------------------------------- */

loom_dtype loom_tensor_dtype(const loom_tensor *t);
int loom_tensor_ndim(const loom_tensor *t);
const int64_t *loom_tensor_shape(const loom_tensor *t);   /* ndim entries */
const int64_t *loom_tensor_strides(const loom_tensor *t); /* in elements */
/* Size of dimension `dim` (negative counts from the end); -1 if out of range. */
int64_t loom_tensor_dim(const loom_tensor *t, int dim);
size_t loom_tensor_numel(const loom_tensor *t);
size_t loom_tensor_nbytes(const loom_tensor *t); /* numel * element size */
bool loom_tensor_is_contiguous(const loom_tensor *t);
/* Pointer to the first element (storage base + offset). Strided tensors: use the strides. */
void *loom_tensor_data(const loom_tensor *t);
/* True if a and b have the same shape. */
bool loom_tensor_same_shape(const loom_tensor *a, const loom_tensor *b);
/* The pool the tensor's storage is counted against. */
loom_pool loom_tensor_pool(const loom_tensor *t);
/* True if a and b share storage. */
bool loom_tensor_shares_storage(const loom_tensor *a, const loom_tensor *b);
/* Validate a handle: LOOM_EINVAL for NULL, LOOM_EMISUSE for a freed tensor (where detectable),
 * with a message that names `who`. */
int loom_tensor_check(const loom_tensor *t, const char *who);

/* ---- views (share storage) ------------------------------------------------------------ */

/* Same elements in a new shape; one dim may be -1 (inferred). A view when the strides allow
 * it, else a contiguous copy (as torch.reshape). LOOM_ESHAPE if the element counts differ. */
int loom_tensor_reshape(loom_tensor *t, int ndim, const int64_t *shape, loom_tensor **out);
/* Dimensions reordered: out dim i is t's dim perm[i]. perm must be a permutation. */
int loom_tensor_permute(loom_tensor *t, const int *perm, loom_tensor **out);
/* Swap two dimensions (negative dims count from the end). */
int loom_tensor_transpose(loom_tensor *t, int dim0, int dim1, loom_tensor **out);
/* Elements [start, start+length) of dimension dim. */
int loom_tensor_narrow(loom_tensor *t, int dim, int64_t start, int64_t length,
                       loom_tensor **out);
/* Elements start, start+step, ... < end of dimension dim (Python semantics for negative
 * start/end, clamped; step >= 1). */
int loom_tensor_slice(loom_tensor *t, int dim, int64_t start, int64_t end, int64_t step,
                      loom_tensor **out);

/* ---- data ----------------------------------------------------------------------------- */

/* A contiguous tensor with t's values: t itself (a new reference) if already contiguous. */
int loom_tensor_contiguous(loom_tensor *t, loom_tensor **out);
/* A new contiguous tensor with t's values converted to dt (a copy even if dt is t's dtype).
 * f32 <-> f16/bf16 use the dispatched conversion kernels. */
int loom_tensor_cast(loom_tensor *t, loom_dtype dt, loom_tensor **out);
/* A new contiguous copy of t. */
int loom_tensor_clone(loom_tensor *t, loom_tensor **out);
/* Copy src's values into dst (same shape; dtypes may differ and are converted; either may be
 * strided). */
int loom_tensor_copy(loom_tensor *dst, const loom_tensor *src);
/* Set every element to v (rounded to the dtype). */
int loom_tensor_fill(loom_tensor *t, double v);
/* Copy t's values, converted to dt, into a contiguous caller buffer of `cap` bytes. */
int loom_tensor_read(const loom_tensor *t, loom_dtype dt, void *buf, size_t cap);
/* The element at a multi-index (ndim entries), as double. */
int loom_tensor_get(const loom_tensor *t, const int64_t *index, double *out);
/* Set the element at a multi-index. */
int loom_tensor_set(loom_tensor *t, const int64_t *index, double v);
/* The value of a one-element tensor. */
int loom_tensor_item(const loom_tensor *t, double *out);

/* ---- printing ------------------------------------------------------------------------- */

/* Write a readable description: dtype, shape, strides (if not contiguous), and the values
 * (the first and last few of each dimension when large). */
int loom_tensor_print(const loom_tensor *t, FILE *f);
/* The same into buf (cap bytes, always NUL-terminated); LOOM_OK even if truncated. */
int loom_tensor_format(const loom_tensor *t, char *buf, size_t cap);

#ifdef __cplusplus
}
#endif
#endif
