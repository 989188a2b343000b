/* gradcheck.h: the ops tests' gradient checker. An op under test is a function of n tensors
 * giving one tensor. gc_run checks, for the inputs described:
 *  - f32: the analytic gradient (backward of L = sum(y * R), R fixed random) against central
 *    finite differences of L computed in double (|num - ana| <= tol * (1 + |ana|));
 *  - f16 and bf16: the op on low-precision copies of the same values (leaves in that dtype)
 *    against the f32 op: outputs and gradients within lp_tol * max|f32 value| (+1e-3), and
 *    every gradient in its leaf's dtype.
 * Input values are rounded to bf16 first, so all three dtypes see the same numbers. */
#ifndef LOOM_TESTS_GRADCHECK_H
#define LOOM_TESTS_GRADCHECK_H

#include "lt.h"

typedef int (*gc_fn)(loom_tensor **in, loom_tensor **out, void *ctx);

typedef struct gc_input {
  int ndim;
  int64_t shape[LOOM_MAX_DIMS];
  float lo, hi; /* uniform values in [lo, hi] (both 0: [-1, 1]) */
  bool no_grad; /* a constant input */
} gc_input;

typedef struct gc_opts {
  double eps;    /* finite-difference step (default 1e-2) */
  double tol;    /* f32 tolerance (default 1e-2) */
  double lp_tol; /* f16 / bf16 tolerance relative to max |f32 value| (default 3e-2, f16 1e-2) */
  bool f32_only;
  uint64_t seed;
} gc_opts;

/* Returns the number of failed comparisons (also reported through lt_fail_at). */
int gc_run(const char *what, gc_fn fn, void *ctx, int n, const gc_input *ins,
           const gc_opts *opts);

/* A deterministic uniform value stream (splitmix64). */
float gc_uniform(uint64_t *state, float lo, float hi);
/* A new f32 tensor of the shape filled with uniform values in [lo, hi] rounded to bf16. */
loom_tensor *gc_rand(int ndim, const int64_t *shape, float lo, float hi, uint64_t *state);
/* max |a - b| over max(max |b|, floor): a and b any float dtype, any layout, same numel (a NaN
 * difference gives NaN). */
double gc_rel_diff(loom_tensor *a, loom_tensor *b, double floor);

/* Test-writing shorthands: an op as a gc_fn, an input shape (S) or shape with value range
 * (SR), and a check with default options. */
#define G1(name, expr)                                                                       \
  static int name(loom_tensor **in, loom_tensor **out, void *ctx) {                          \
    (void)ctx;                                                                                \
    return expr;                                                                              \
  }
#define S(nd, ...) {.ndim = nd, .shape = {__VA_ARGS__}}
#define SR(nd, l, h, ...) {.ndim = nd, .shape = {__VA_ARGS__}, .lo = l, .hi = h}
#define CHECK(what, fn, n, ...)                                                              \
  do {                                                                                        \
    gc_input ins_[] = {__VA_ARGS__};                                                          \
    gc_run(what, fn, NULL, n, ins_, NULL);                                                    \
  } while (0)

#endif
