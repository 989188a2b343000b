/* ops_int.h: what the op files share (private to loom): the dispatch point with its autocast
 * hook, input checks, f32 staging of inputs and outputs, broadcasting iteration, and the
 * recording helpers. */
#ifndef LOOM_OPS_INT_H
#define LOOM_OPS_INT_H

#include "autograd/autograd_int.h"
#include "loom/ops.h"

#include <stdatomic.h>

/* ---- autocast hook -------------------------------------------------------------------- */

/* Dispatch consults this thread's autocast state (loom_autocast_dtype_for, loom/autocast.h)
 * for every op but casts: floating inputs are cast (with loom_cast, so on the tape) to the
 * dtype the policy gives; casts of f32 leaves are cached for the outermost region. Tests may
 * install this hook to replace the policy: given an op's kind and the dtypes of its n
 * floating inputs, return true and set *dt, or false to leave them. NULL (the default) uses
 * autocast. Relaxed atomic: install it before starting threads. */
typedef bool (*loom__autocast_fn)(loom_op_kind kind, const loom_dtype *in, int n,
                                  loom_dtype *dt);
extern _Atomic(loom__autocast_fn) loom__autocast_hook;

/* ---- dispatch ------------------------------------------------------------------------- */

#define LOOM__OP_MAX_IN 4

/* One op application: its (possibly autocast) inputs. op_begin checks each non-NULL input is
 * a live tensor, then applies the autocast policy to the floating ones (through loom_cast, so
 * the cast is on the tape). Use c->in[i] afterwards; op_end releases the casts. */
typedef struct loom__op {
  loom_op_kind kind;
  const char *name;
  int n;
  loom_tensor **in, **cast; /* n entries: the small arrays, or allocated when n is larger */
  loom_tensor *in_small[LOOM__OP_MAX_IN], *cast_small[LOOM__OP_MAX_IN];
} loom__op;

int loom__op_begin(loom__op *c, loom_op_kind kind, loom_tensor *const *in, int n);
void loom__op_end(loom__op *c);
/* An op's single exit (after `done:` and its own frees): on success (rc == LOOM_OK) *out
 * receives y, else y is freed; then the op ends. Returns rc. */
int loom__op_finish(loom__op *c, int rc, loom_tensor *y, loom_tensor **out);

/* Checks: required tensor (NULL -> EINVAL naming `arg`), floating dtype, same dtype. */
int loom__check_in(const char *op, const loom_tensor *t, const char *arg);
int loom__check_float(const char *op, const loom_tensor *t, const char *arg);
int loom__check_same_dtype(const char *op, const loom_tensor *a, const loom_tensor *b);
/* out must be non-NULL; sets *out = NULL. */
int loom__check_out(const char *op, loom_tensor **out);
/* Normalise dim (negative from the end) for a tensor of rank ndim. */
int loom__norm_dim(const char *op, int dim, int ndim, int *out);

/* ---- f32 staging ---------------------------------------------------------------------- */

/* A float view of tensor data: p points into the tensor itself when it is contiguous f32,
 * else into tmp, an owned f32 copy. */
typedef struct loom__fbuf {
  float *p;
  float *tmp;
} loom__fbuf;

int loom__f32_in(const loom_tensor *t, loom__fbuf *b);
/* A new contiguous tensor of dtype dt and the given shape in *t, and b->p: where to write its
 * values as f32 (the tensor itself when dt is f32, else a buffer that f32_out_commit
 * converts into it). */
int loom__f32_out(loom_dtype dt, int ndim, const int64_t *shape, loom_tensor **t,
                  loom__fbuf *b);
void loom__f32_out_commit(loom_tensor *t, loom__fbuf *b);
void loom__fbuf_free(loom__fbuf *b);
/* A new f32 contiguous tensor (zeroed if zero) of the given shape: gradients. */
int loom__grad_new(int ndim, const int64_t *shape, bool zero, loom_tensor **out);
static inline float *loom__f(loom_tensor *t) { return (float *)loom_tensor_data(t); }
/* Where input i of node n's gradient goes: straight into a leaf's f32 buffer when autograd
 * offers a sink (loom__grad_sink), else a new uninitialised f32 temporary put in gin[i]. *p
 * receives the buffer, *beta 0 (overwrite every element) or 1 (add into it). Ask right
 * before writing it, and write it before asking for another input's. */
int loom__grad_dst(loom__node *n, int i, loom_tensor **gin, float **p, float *beta);
/* The same, also giving the sink (s->bound_wanted false when there is none) so that the op can
 * bound what it wrote (loom__sink_bound). */
int loom__grad_dst_sink(loom__node *n, int i, loom_tensor **gin, float **p, float *beta,
                        loom__sink *s);

/* ---- broadcasting --------------------------------------------------------------------- */

/* The broadcast shape of a and b (NumPy rules) or LOOM_ESHAPE naming op. */
int loom__broadcast_shape(const char *op, int na, const int64_t *sa, int nb, const int64_t *sb,
                          int *nout, int64_t *sout);
/* Element strides for reading a contiguous operand of shape (nd, shape) as if it had the
 * broadcast shape (nout, sout): 0 along broadcast dims. */
void loom__bcast_strides(int nout, const int64_t *sout, int nd, const int64_t *shape,
                         int64_t *strides);

/* One innermost run of an iteration: n elements, operand k at p[k] with stride s[k]. */
typedef void (*loom__run_fn)(int64_t n, float *p0, const float *p1, const float *p2,
                             int64_t s0, int64_t s1, int64_t s2, void *ctx);
/* Walk the index space `shape` calling fn on innermost runs, with up to three operands (p1,
 * p2 may be NULL) at the given element strides. Dims are merged where every operand allows. */
void loom__iter3(int ndim, const int64_t *shape, float *p0, const int64_t *st0, const float *p1,
                 const int64_t *st1, const float *p2, const int64_t *st2, loom__run_fn fn,
                 void *ctx);
/* dst (shape nd/shape, zeroed here) = g (contiguous, shape nout/sout) summed over the dims
 * broadcast from dst's shape to sout's; a copy of g when the shapes are the same. */
void loom__reduce_to(const float *g, int nout, const int64_t *sout, float *dst, int nd,
                     const int64_t *shape);

/* ---- recording ------------------------------------------------------------------------ */

/* If c's inputs need grad, record a node with backward bwd on out and return it in *node
 * (else *node = NULL). The caller then saves what backward needs with loom__node_save. */
int loom__op_record(loom__op *c, loom_tensor *out, loom__backward_fn bwd, loom__node **node);

/* ---- attention (attention.c) ---------------------------------------------------------- */

/* loom_scaled_dot_product_attention's reference, unfused, from loom's own ops: q k^T (matmul),
 * times 1/sqrt(D), plus a 0 / -inf causal mask, softmax, times v; every step on the tape, the
 * [B, H, T, T] scores materialised. What tests and bench/bench_attention.c compare with. */
int loom__sdpa_unfused(loom_tensor *q, loom_tensor *k, loom_tensor *v, bool is_causal,
                       loom_tensor **out);

/* ---- magnitudes (absmax.c, absmax_avx2.c, absmax_avx512.c) ---------------------------- */

/* max |p[i]| over n elements of dt (f32, f16, bf16), or INFINITY if one is inf or NaN; 0 for
 * n 0. _level runs the given CPU level's loop (tests compare levels with scalar). */
double loom__absmax(const void *p, loom_dtype dt, size_t n);
double loom__absmax_level(const void *p, loom_dtype dt, size_t n, loom_cpu_level level);

/* One table per level: the largest sign-cleared 32-bit (f32) or 16-bit (f16, bf16) pattern
 * of n elements; the scalar loops also finish the SIMD levels' ragged tails. */
typedef struct loom__absmax_kernels {
  uint32_t (*max32)(const uint32_t *x, size_t n);
  uint32_t (*max16)(const uint16_t *x, size_t n);
} loom__absmax_kernels;
LOOM__KERNEL_TABLES(loom__absmax_kernels, loom__absmax_kernels, loom__absmax_kernels_for,
                    loom__absmax_k);
uint32_t loom__absmax32_scalar(const uint32_t *x, size_t n);
uint32_t loom__absmax16_scalar(const uint16_t *x, size_t n);

#endif
