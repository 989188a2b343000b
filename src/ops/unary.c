/* unary.c: elementwise functions of one tensor and a scalar parameter, forward and backward:
 * neg, relu, gelu (exact, tanh), tanh, sigmoid, exp, log, sqrt, pow, and the scalar
 * variants add/sub/mul/div by a scalar. The math lives in unary_kernels.c. relu on f16/bf16
 * works on the 16-bit values directly (it only selects them); the others go through f32. */
#include "ops/ops_int.h"
#include "ops/gemm.h"
#include "ops/unary_int.h"

/* Elementwise, so a long tensor runs in chunks over the GEMM's thread count (loom__gemm_threads,
 * loom_set_num_threads); every element's value is the same whatever the split. */
enum { PAR_MIN = 1 << 16, CHUNK = 1 << 14 };

/* Floats of a 16-bit tensor's chunk staged at a time, on the stack (a few KiB, so the staged
 * values stay in L1 between the widening, the kernel and the rounding). */
enum { STAGE = 2048 };

/* One call of a forward (g NULL: out = f(x)) or backward (out = g * f'(x), from x and/or y)
 * kernel, run in chunks. A 16-bit x, y or out (x16, y16, out16 of dtype dt, contiguous) is
 * widened to f32 (out: rounded from it) a piece of a chunk at a time, instead of a whole f32
 * copy of the tensor made before and rounded after: the same values, a fraction of the memory
 * traffic. GELU (tanh form) on bf16 x has kernels that read (and write) the bf16 values
 * directly, widening in registers (fwd16 / bwd16, set instead of fwd / bwd): no staging. */
typedef struct job {
  loom__unary_fwd_fn fwd;
  loom__unary_bwd_fn bwd;
  float *out;
  const float *g, *x, *y;
  double p;
  loom_dtype dt;
  const uint16_t *x16, *y16;
  uint16_t *out16;
  loom__gelu_bf16_fn fwd16;
  loom__gelu_bf16_bwd_fn bwd16;
} job;

static void run_piece(const job *j, size_t i, size_t m) {
  float xs[STAGE], ys[STAGE], os[STAGE];
  for (size_t k = i; k < i + m; k += STAGE) {
    size_t e = i + m - k < STAGE ? i + m - k : STAGE;
    const float *x = j->x ? j->x + k : NULL, *y = j->y ? j->y + k : NULL;
    if (j->x16) {
      loom__widen(j->dt, j->x16 + k, xs, e);
      x = xs;
    }
    if (j->y16) {
      loom__widen(j->dt, j->y16 + k, ys, e);
      y = ys;
    }
    float *o = j->out16 ? os : j->out + k;
    if (j->fwd) j->fwd(o, x, e, (float)j->p);
    else j->bwd(o, j->g + k, x, y, e, j->p);
    if (j->out16) loom__narrow(j->dt, os, j->out16 + k, e);
  }
}

static void run(const job *j, size_t n) {
  int64_t chunks = (int64_t)((n + CHUNK - 1) / CHUNK);
  int t = n >= PAR_MIN ? loom__gemm_threads() : 1;
  bool staged = j->x16 || j->y16 || j->out16;
  (void)t; /* unused without OpenMP */
#pragma omp parallel for num_threads(t) if (t > 1 && chunks > 1)
  for (int64_t c = 0; c < chunks; c++) {
    size_t i = (size_t)c * CHUNK, m = n - i < CHUNK ? n - i : CHUNK;
    const float *x = j->x ? j->x + i : NULL, *y = j->y ? j->y + i : NULL;
    if (j->fwd16) j->fwd16(j->out16 + i, j->x16 + i, m);
    else if (j->bwd16) j->bwd16(j->out + i, j->g + i, j->x16 + i, m);
    else if (staged) run_piece(j, i, m);
    else if (j->fwd) j->fwd(j->out + i, x, m, (float)j->p);
    else j->bwd(j->out + i, j->g + i, x, y, m, j->p);
  }
}

/* A 16-bit (f16 / bf16) contiguous tensor's values, or NULL (then staged whole by f32_in). */
static const uint16_t *bits16(const loom_tensor *t) {
  return t && (t->dtype == LOOM_BF16 || t->dtype == LOOM_F16) && loom_tensor_is_contiguous(t)
             ? loom_tensor_data(t)
             : NULL;
}

/* +inf's bits in a 16-bit float dtype, or 0 for f32 (relu then goes through f32). */
static uint16_t inf16(loom_dtype dt) {
  return dt == LOOM_BF16 ? 0x7f80 : dt == LOOM_F16 ? 0x7c00 : 0;
}

static int unary_backward(loom__node *n, loom_tensor *g, loom_tensor **gin) {
  int rc = LOOM_OK;
  loom__fbuf fx = {0}, fy = {0};
  const loom_tensor *y = n->saved[1]; /* x and y, where saved, share the op's dtype */
  uint16_t inf = y ? inf16(y->dtype) : 0;
  /* elementwise, so g can be overwritten in place when nobody else holds it */
  if (loom__grad_exclusive(g)) gin[0] = loom_tensor_retain(g);
  else LOOM_TRY(loom__grad_new(n->in[0].ndim, n->in[0].shape, false, &gin[0]));
  if (loom__dry()) goto done;
  if (n->i[0] == LOOM__U_RELU && inf && loom_tensor_is_contiguous(y)) {
    loom__unary_kernels()->relu16_bwd(loom__f(gin[0]), loom__f(g), loom_tensor_data(y),
                                      loom_tensor_numel(g), inf);
    goto done;
  }
  job j = {NULL, loom__unary_kernels()->bwd[n->i[0]], loom__f(gin[0]), loom__f(g), NULL, NULL,
           n->f[0], LOOM_F32, bits16(n->saved[0]), bits16(n->saved[1]), NULL, NULL, NULL};
  for (int k = 0; k < 2; k++) {
    const loom_tensor *s = n->saved[k];
    if (s && bits16(s)) j.dt = s->dtype;
    else if (s) LOOM_TRY(loom__f32_in(s, k ? &fy : &fx));
  }
  j.x = fx.p;
  j.y = fy.p;
  if (n->i[0] == LOOM__U_GELU_TANH && j.x16 && j.dt == LOOM_BF16)
    j.bwd16 = loom__unary_kernels()->gelu_tanh_bf16_bwd;
  run(&j, (size_t)loom_tensor_numel(g));
  done:
  loom__fbuf_free(&fx);
  loom__fbuf_free(&fy);
  return rc;
}

int loom__unary_op(loom__unary u, loom_tensor *x, double p, loom_tensor **out) {
  const loom__unary_def *d = loom__unary_def_get(u);
  const char *name = d->name;
  int rc = loom__check_out(name, out);
  if (rc) return rc;
  if ((rc = loom__check_float(name, x, "x"))) return rc;
  loom__op c;
  loom_tensor *y = NULL;
  loom__fbuf fx = {0}, fy = {0};
  loom__node *nd = NULL;
  if ((rc = loom__op_begin(&c, d->kind, &x, 1))) return rc;
  x = c.in[0];
  uint16_t inf = inf16(x->dtype);
  if (u == LOOM__U_RELU && inf && loom_tensor_is_contiguous(x)) { /* exact on the bits */
    LOOM_TRY(loom_tensor_empty(x->dtype, x->ndim, x->shape, &y));
    if (!loom__dry()) loom__unary_kernels()->relu16(loom_tensor_data(y), loom_tensor_data(x),
                                  loom_tensor_numel(x), inf);
  } else if (bits16(x)) { /* 16-bit in and out, staged a piece at a time */
    LOOM_TRY(loom_tensor_empty(x->dtype, x->ndim, x->shape, &y));
    job j = {loom__unary_kernels()->fwd[u], NULL, NULL, NULL, NULL, NULL, (float)p,
             x->dtype, bits16(x), NULL, loom_tensor_data(y), NULL, NULL};
    if (u == LOOM__U_GELU_TANH && x->dtype == LOOM_BF16)
      j.fwd16 = loom__unary_kernels()->gelu_tanh_bf16;
    if (!loom__dry()) run(&j, (size_t)loom_tensor_numel(x));
  } else {
    LOOM_TRY(loom__f32_in(x, &fx));
    LOOM_TRY(loom__f32_out(x->dtype, x->ndim, x->shape, &y, &fy));
    job j = {loom__unary_kernels()->fwd[u], NULL, fy.p, NULL, fx.p, NULL, (float)p, LOOM_F32,
             NULL, NULL, NULL, NULL, NULL};
    if (!loom__dry()) run(&j, (size_t)loom_tensor_numel(x));
    loom__f32_out_commit(y, &fy);
  }
  LOOM_TRY(loom__op_record(&c, y, unary_backward, &nd));
  if (nd) {
    nd->name = name;
    nd->i[0] = u;
    nd->f[0] = p;
    if (d->saves_x) LOOM_TRY(loom__node_save(nd, 0, x));
    if (d->saves_y) LOOM_TRY(loom__node_save(nd, 1, y));
  }
done:
  loom__fbuf_free(&fx);
  loom__fbuf_free(&fy);
  return loom__op_finish(&c, rc, y, out);
}

int loom_neg(loom_tensor *x, loom_tensor **out) { return loom__unary_op(LOOM__U_NEG, x, 0, out); }
int loom_relu(loom_tensor *x, loom_tensor **out) { return loom__unary_op(LOOM__U_RELU, x, 0, out); }
int loom_tanh(loom_tensor *x, loom_tensor **out) { return loom__unary_op(LOOM__U_TANH, x, 0, out); }
int loom_exp(loom_tensor *x, loom_tensor **out) { return loom__unary_op(LOOM__U_EXP, x, 0, out); }
int loom_log(loom_tensor *x, loom_tensor **out) { return loom__unary_op(LOOM__U_LOG, x, 0, out); }
int loom_sqrt(loom_tensor *x, loom_tensor **out) { return loom__unary_op(LOOM__U_SQRT, x, 0, out); }
int loom_sigmoid(loom_tensor *x, loom_tensor **out) {
  return loom__unary_op(LOOM__U_SIGMOID, x, 0, out);
}
int loom_pow(loom_tensor *x, double p, loom_tensor **out) {
  return loom__unary_op(LOOM__U_POW, x, p, out);
}
int loom_gelu(loom_tensor *x, loom_gelu_mode mode, loom_tensor **out) {
  if (mode != LOOM_GELU_EXACT && mode != LOOM_GELU_TANH) {
    if (out) *out = NULL;
    return loom__fail(LOOM_EINVAL, "gelu: mode %d is neither LOOM_GELU_EXACT nor LOOM_GELU_TANH",
                      (int)mode);
  }
  return loom__unary_op(mode == LOOM_GELU_TANH ? LOOM__U_GELU_TANH : LOOM__U_GELU, x, 0, out);
}
int loom_add_scalar(loom_tensor *a, double s, loom_tensor **out) {
  return loom__unary_op(LOOM__U_ADD_SCALAR, a, s, out);
}
int loom_sub_scalar(loom_tensor *a, double s, loom_tensor **out) {
  return loom__unary_op(LOOM__U_ADD_SCALAR, a, -s, out);
}
int loom_mul_scalar(loom_tensor *a, double s, loom_tensor **out) {
  return loom__unary_op(LOOM__U_MUL_SCALAR, a, s, out);
}
int loom_div_scalar(loom_tensor *a, double s, loom_tensor **out) {
  return loom__unary_op(LOOM__U_DIV_SCALAR, a, s, out);
}
