/* binary.c: add, sub, mul, div with NumPy broadcasting, forward and backward. Inputs are
 * staged as f32 and the output converted to the inputs' dtype; backward reduces the
 * gradient over broadcast dims back to each input's shape. Long operands of one shape run
 * over the caller's OpenMP team. */
#include "ops/ops_int.h"

#include <string.h>

typedef enum { B_ADD, B_SUB, B_MUL, B_DIV } bop;

/* Innermost runs: y = a op b with strides (contiguous fast paths first, so they vectorize). */
#define BIN_RUN(NAME, EXPR)                                                                   \
  static void NAME(int64_t n, float *y, const float *a, const float *b, int64_t sy,          \
                   int64_t sa, int64_t sb, void *ctx) {                                       \
    if (sy == 1 && sa == 1 && sb == 1) {                                                      \
      for (int64_t i = 0; i < n; i++) {                                                       \
        float x = a[i], z = b[i];                                                             \
        y[i] = EXPR;                                                                          \
      }                                                                                       \
    } else if (sy == 1 && sa == 1 && sb == 0) {                                               \
      float z = b[0];                                                                         \
      for (int64_t i = 0; i < n; i++) {                                                       \
        float x = a[i];                                                                       \
        y[i] = EXPR;                                                                          \
      }                                                                                       \
    } else if (sy == 1 && sa == 0 && sb == 1) {                                               \
      float x = a[0];                                                                         \
      for (int64_t i = 0; i < n; i++) {                                                       \
        float z = b[i];                                                                       \
        y[i] = EXPR;                                                                          \
      }                                                                                       \
    } else {                                                                                  \
      for (int64_t i = 0; i < n; i++) {                                                       \
        float x = a[i * sa], z = b[i * sb];                                                   \
        y[i * sy] = EXPR;                                                                     \
      }                                                                                       \
    }                                                                                         \
  }

BIN_RUN(run_add, x + z)
BIN_RUN(run_sub, x - z)
BIN_RUN(run_mul, x *z)
BIN_RUN(run_div, x / z)
BIN_RUN(run_div_grad_b, -x / (z * z)) /* used as g * (a / b^2) in two steps below */

static loom__run_fn const fwd_runs[] = {run_add, run_sub, run_mul, run_div};
static const loom_op_kind kinds[] = {LOOM_OPK_ADD, LOOM_OPK_SUB, LOOM_OPK_MUL, LOOM_OPK_DIV};

/* Long operands of one shape (a residual connection's add): chunks over the caller's OpenMP
 * team (elementwise: the split changes no value). */
enum { PAR_MIN = 1 << 17, CHUNK = 1 << 14 };

static bool same_shape(int na, const int64_t *sa, int nb, const int64_t *sb) {
  if (na != nb) return false;
  for (int i = 0; i < na; i++)
    if (sa[i] != sb[i]) return false;
  return true;
}

/* out (contiguous, shape no/so) = a (shape na/sa) op b (shape nb/sb), all f32 contiguous. */
static void bin_apply(loom__run_fn fn, int no, const int64_t *so, float *out, const float *a,
                      int na, const int64_t *sa, const float *b, int nb, const int64_t *sb) {
  if (loom__dry()) return; /* as loom__iter3: a dry run computes nothing */
  int64_t n = 1;
  for (int i = 0; i < no; i++) n *= so[i];
  if (n >= PAR_MIN && same_shape(no, so, na, sa) && same_shape(no, so, nb, sb)) {
    int64_t chunks = (n + CHUNK - 1) / CHUNK;
#pragma omp parallel for if (LOOM__OMP_TEAM)
    for (int64_t c = 0; c < chunks; c++) {
      int64_t at = c * CHUNK;
      fn(n - at < CHUNK ? n - at : CHUNK, out + at, a + at, b + at, 1, 1, 1, NULL);
    }
    return;
  }
  int64_t st_o[LOOM_MAX_DIMS], st_a[LOOM_MAX_DIMS], st_b[LOOM_MAX_DIMS];
  loom__bcast_strides(no, so, no, so, st_o);
  loom__bcast_strides(no, so, na, sa, st_a);
  loom__bcast_strides(no, so, nb, sb, st_b);
  loom__iter3(no, so, out, st_o, a, st_a, b, st_b, fn, NULL);
}

/* Gradient for input `which` (0: a, 1: b): node->i[0] is the op. */
static int bin_backward(loom__node *n, loom_tensor *g, loom_tensor **gin) {
  bop op = (bop)n->i[0];
  int rc = LOOM_OK;
  loom__fbuf fa = {0}, fb = {0};
  float *tmp = NULL;
  const loom__edge *ea = &n->in[0], *eb = &n->in[1];
  int no = n->out_ndim;
  const int64_t *so = n->out_shape;
  size_t cnt = loom_tensor_numel(g);
  if (op == B_MUL || op == B_DIV) {
    LOOM_TRY(loom__f32_in(n->saved[0], &fa));
    LOOM_TRY(loom__f32_in(n->saved[1], &fb));
    tmp = loom__malloc(LOOM_POOL_COMPUTE, (cnt ? cnt : 1) * sizeof *tmp);
    LOOM_TRY_ALLOC(tmp, "a gradient buffer");
  }
  int64_t sg[LOOM_MAX_DIMS];
  for (int w = 0; w < 2; w++) {
    if (!loom__node_needs(n, w)) continue;
    const loom__edge *e = w ? eb : ea;
    if ((op == B_ADD || (op == B_SUB && w == 0)) && e->ndim == no &&
        !memcmp(e->shape, so, (size_t)no * sizeof *so)) {
      /* g itself, shared by both inputs where both take it: the engine copies a gradient
       * before it adds into it or adopts it unless it holds the only reference (a residual
       * add's backward no longer copies g twice) */
      gin[w] = loom_tensor_retain(g);
      continue;
    }
    LOOM_TRY(loom__grad_new(e->ndim, e->shape, false, &gin[w]));
    const float *src = loom__f(g);
    if (op == B_MUL) { /* g * other */
      const loom__edge *o = w ? ea : eb;
      bin_apply(run_mul, no, so, tmp, loom__f(g), no, so, w ? fa.p : fb.p, o->ndim, o->shape);
      src = tmp;
    } else if (op == B_DIV && w == 0) { /* g / b */
      bin_apply(run_div, no, so, tmp, loom__f(g), no, so, fb.p, eb->ndim, eb->shape);
      src = tmp;
    } else if (op == B_DIV) { /* g * (-a / b^2) */
      bin_apply(run_div_grad_b, no, so, tmp, fa.p, ea->ndim, ea->shape, fb.p, eb->ndim,
                eb->shape);
      loom__bcast_strides(no, so, no, so, sg);
      loom__iter3(no, so, tmp, sg, tmp, sg, loom__f(g), sg, run_mul, NULL);
      src = tmp;
    }
    if (same_shape(no, so, e->ndim, e->shape)) /* nothing to reduce: a copy (on the team) */
      LOOM_TRY(loom_convert(src, LOOM_F32, loom__f(gin[w]), LOOM_F32, cnt));
    else
      loom__reduce_to(src, no, so, loom__f(gin[w]), e->ndim, e->shape);
    if (op == B_SUB && w == 1) {
      float *d = loom__f(gin[w]);
      size_t m = loom_tensor_numel(gin[w]);
      for (size_t i = 0; i < m; i++) d[i] = -d[i];
    }
  }
done:
  loom__fbuf_free(&fa);
  loom__fbuf_free(&fb);
  loom__free(tmp);
  return rc;
}

static int binary(bop op, loom_tensor *a, loom_tensor *b, loom_tensor **out) {
  const char *name = loom_op_kind_name(kinds[op]);
  int rc = loom__check_out(name, out);
  if (rc) return rc;
  if ((rc = loom__check_float(name, a, "a")) || (rc = loom__check_float(name, b, "b")))
    return rc;
  loom__op c;
  loom_tensor *in[2] = {a, b}, *y = NULL;
  loom__fbuf fa = {0}, fb = {0}, fy = {0};
  loom__node *nd = NULL;
  if ((rc = loom__op_begin(&c, kinds[op], in, 2))) return rc;
  a = c.in[0];
  b = c.in[1];
  int no;
  int64_t so[LOOM_MAX_DIMS];
  LOOM_TRY(loom__check_same_dtype(name, a, b));
  LOOM_TRY(loom__broadcast_shape(name, a->ndim, a->shape, b->ndim, b->shape, &no, so));
  LOOM_TRY(loom__f32_in(a, &fa));
  LOOM_TRY(loom__f32_in(b, &fb));
  LOOM_TRY(loom__f32_out(a->dtype, no, so, &y, &fy));
  bin_apply(fwd_runs[op], no, so, fy.p, fa.p, a->ndim, a->shape, fb.p, b->ndim, b->shape);
  loom__f32_out_commit(y, &fy);
  LOOM_TRY(loom__op_record(&c, y, bin_backward, &nd));
  if (nd) {
    nd->i[0] = op;
    if (op == B_MUL || op == B_DIV) {
      LOOM_TRY(loom__node_save(nd, 0, a));
      LOOM_TRY(loom__node_save(nd, 1, b));
    }
  }
done:
  loom__fbuf_free(&fa);
  loom__fbuf_free(&fb);
  loom__fbuf_free(&fy);
  return loom__op_finish(&c, rc, y, out);
}

int loom_add(loom_tensor *a, loom_tensor *b, loom_tensor **out) { return binary(B_ADD, a, b, out); }
int loom_sub(loom_tensor *a, loom_tensor *b, loom_tensor **out) { return binary(B_SUB, a, b, out); }
int loom_mul(loom_tensor *a, loom_tensor *b, loom_tensor **out) { return binary(B_MUL, a, b, out); }
int loom_div(loom_tensor *a, loom_tensor *b, loom_tensor **out) { return binary(B_DIV, a, b, out); }
