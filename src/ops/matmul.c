/* matmul.c: matmul (2-D and batched) and linear (x W^T + b), forward and backward, through
 * the GEMM kernel (gemm.h). Operands go to the kernel in their own dtype; outputs and
 * gradients are computed with f32 accumulation. Backward rounds the incoming f32 gradient to
 * the operands' dtype once (as PyTorch's gradients have the activation's dtype) so the
 * kernel's fast low-precision path is used. */
#include "ops/gemm.h"
#include "ops/ops_int.h"

#include <math.h>
#include <string.h>

/* The gradient g (f32) in dtype dt: g itself (a new reference) when dt is f32. */
static int grad_as(loom_tensor *g, loom_dtype dt, loom_tensor **out) {
  if (dt == LOOM_F32) {
    *out = loom_tensor_retain(g);
    return LOOM_OK;
  }
  return loom_tensor_cast(g, dt, out);
}

/* C[batch][M,N] (+)= op(A) op(B) (+ bias, f32 [N], on every row) over contiguous operands.
 * With K = 0 the product is zero: C is zeroed (or set to the bias) when beta is 0 (it may be
 * an uninitialised gradient buffer), else left. */
static int gemm_bias(loom_dtype ab, loom_dtype cdt, int64_t batch, int64_t M, int64_t N,
                     int64_t K, const void *A, bool ta, int64_t sa, const void *B, bool tb,
                     int64_t sb, void *C, int64_t sc, float beta, const float *bias) {
  if (batch == 0 || M == 0 || N == 0) return LOOM_OK;
  if (K == 0) {
    size_t es = loom_dtype_size(cdt);
    for (int64_t i = 0; beta == 0.0f && i < (sc ? batch : 1); i++)
      if (!loom__dry()) memset((char *)C + (size_t)(i * sc) * es, 0, (size_t)(M * N) * es);
    for (int64_t r = 0; bias && beta == 0.0f && r < batch * M; r++) /* linear: rows = bias */
      loom_convert(bias, LOOM_F32, (char *)C + (size_t)(r * N) * es, cdt, (size_t)N);
    return LOOM_OK;
  }
  loom__gemm_args g = {.trans_a = ta, .trans_b = tb, .batch = batch, .M = M, .N = N, .K = K,
                       .alpha = 1.0f, .beta = beta, .A = A, .lda = ta ? M : K, .stride_a = sa,
                       .B = B, .ldb = tb ? K : N, .stride_b = sb, .C = C, .ldc = N,
                       .stride_c = sc, .ab_dtype = ab, .c_dtype = cdt, .bias = bias};
  return loom__gemm(&g);
}

static int gemm(loom_dtype ab, loom_dtype cdt, int64_t batch, int64_t M, int64_t N, int64_t K,
                const void *A, bool ta, int64_t sa, const void *B, bool tb, int64_t sb, void *C,
                int64_t sc, float beta) {
  return gemm_bias(ab, cdt, batch, M, N, K, A, ta, sa, B, tb, sb, C, sc, beta, NULL);
}

/* ---- matmul --------------------------------------------------------------------------- */

/* Shapes: a [..., M, K], b [..., K, N]; batch counts ba, bb (1 for 2-D). */
typedef struct mm_dims {
  int64_t M, N, K, ba, bb, batch;
} mm_dims;

static void mm_dims_of(int na, const int64_t *sa, int nb, const int64_t *sb, mm_dims *d) {
  d->M = sa[na - 2];
  d->K = sa[na - 1];
  d->N = sb[nb - 1];
  d->ba = d->bb = 1;
  for (int i = 0; i < na - 2; i++) d->ba *= sa[i];
  for (int i = 0; i < nb - 2; i++) d->bb *= sb[i];
  d->batch = d->ba > d->bb ? d->ba : d->bb;
}

static int matmul_backward(loom__node *n, loom_tensor *g, loom_tensor **gin) {
  int rc = LOOM_OK;
  const loom_tensor *a = n->saved[0], *b = n->saved[1];
  loom_dtype dt = a->dtype;
  loom_tensor *gd = NULL;
  float *dst, beta;
  mm_dims d;
  mm_dims_of(a->ndim, a->shape, b->ndim, b->shape, &d);
  LOOM_TRY(grad_as(g, dt, &gd));
  const void *G = loom_tensor_data(gd), *A = loom_tensor_data(a), *B = loom_tensor_data(b);
  size_t es = loom_dtype_size(dt);
  if (loom__node_needs(n, 0)) { /* gA = G B^T */
    LOOM_TRY(loom__grad_dst(n, 0, gin, &dst, &beta));
    if (d.ba == d.batch) {
      LOOM_TRY(gemm(dt, LOOM_F32, d.batch, d.M, d.K, d.N, G, false, d.M * d.N, B, true,
                    d.bb == 1 ? 0 : d.K * d.N, dst, d.M * d.K, beta));
    } else { /* a shared by every batch: sum the products */
      for (int64_t i = 0; i < d.batch; i++)
        LOOM_TRY(gemm(dt, LOOM_F32, 1, d.M, d.K, d.N, (const char *)G + (size_t)(i * d.M * d.N) * es,
                      false, 0, (const char *)B + (size_t)(i * d.K * d.N) * es, true, 0, dst, 0,
                      i ? 1.0f : beta));
    }
  }
  if (loom__node_needs(n, 1)) { /* gB = A^T G */
    LOOM_TRY(loom__grad_dst(n, 1, gin, &dst, &beta));
    if (d.bb == d.batch) {
      LOOM_TRY(gemm(dt, LOOM_F32, d.batch, d.K, d.N, d.M, A, true, d.ba == 1 ? 0 : d.M * d.K, G,
                    false, d.M * d.N, dst, d.K * d.N, beta));
    } else { /* b shared: one GEMM over the stacked rows of a and G */
      LOOM_TRY(gemm(dt, LOOM_F32, 1, d.K, d.N, d.batch * d.M, A, true, 0, G, false, 0, dst, 0,
                    beta));
    }
  }
done:
  loom_tensor_free(gd);
  return rc;
}

bool loom_ops_native_dtype(loom_dtype dt) {
  return loom__gemm_native(dt) && loom__conv2d_native(dt);
}

int loom_matmul(loom_tensor *a, loom_tensor *b, loom_tensor **out) {
  static const char *name = "matmul";
  int rc = loom__check_out(name, out);
  if (rc) return rc;
  if ((rc = loom__check_float(name, a, "a")) || (rc = loom__check_float(name, b, "b")))
    return rc;
  loom__op c;
  loom_tensor *in[2] = {a, b}, *ca = NULL, *cb = NULL, *y = NULL;
  loom__node *nd = NULL;
  char x1[96], x2[96];
  if ((rc = loom__op_begin(&c, LOOM_OPK_MATMUL, in, 2))) return rc;
  a = c.in[0];
  b = c.in[1];
  LOOM_TRY(loom__check_same_dtype(name, a, b));
  if (a->ndim < 2 || b->ndim < 2) {
    rc = loom__fail(LOOM_ESHAPE, "%s: operands must have at least 2 dims, got %s and %s", name,
                    loom__shape_str(a->ndim, a->shape, x1, sizeof x1),
                    loom__shape_str(b->ndim, b->shape, x2, sizeof x2));
    goto done;
  }
  bool batch_ok = a->ndim == 2 || b->ndim == 2 ||
                  (a->ndim == b->ndim &&
                   !memcmp(a->shape, b->shape, (size_t)(a->ndim - 2) * sizeof *a->shape));
  if (a->shape[a->ndim - 1] != b->shape[b->ndim - 2] || !batch_ok) {
    rc = loom__fail(LOOM_ESHAPE, "%s: shapes %s and %s do not match (%s)", name,
                    loom__shape_str(a->ndim, a->shape, x1, sizeof x1),
                    loom__shape_str(b->ndim, b->shape, x2, sizeof x2),
                    batch_ok ? "inner dims differ" : "batch dims differ");
    goto done;
  }
  mm_dims d;
  mm_dims_of(a->ndim, a->shape, b->ndim, b->shape, &d);
  const loom_tensor *big = a->ndim >= b->ndim ? a : b;
  int64_t shape[LOOM_MAX_DIMS];
  int no = big->ndim;
  memcpy(shape, big->shape, (size_t)(no - 2) * sizeof *shape);
  shape[no - 2] = d.M;
  shape[no - 1] = d.N;
  LOOM_TRY(loom_tensor_contiguous(a, &ca));
  LOOM_TRY(loom_tensor_contiguous(b, &cb));
  LOOM_TRY(loom_tensor_zeros(a->dtype, no, shape, &y));
  LOOM_TRY(gemm(a->dtype, a->dtype, d.batch, d.M, d.N, d.K, loom_tensor_data(ca), false,
                d.ba == 1 ? 0 : d.M * d.K, loom_tensor_data(cb), false,
                d.bb == 1 ? 0 : d.K * d.N, loom_tensor_data(y), d.M * d.N, 0.0f));
  LOOM_TRY(loom__op_record(&c, y, matmul_backward, &nd));
  if (nd) {
    LOOM_TRY(loom__node_save(nd, 0, ca));
    LOOM_TRY(loom__node_save(nd, 1, cb));
  }
done:
  loom_tensor_free(ca);
  loom_tensor_free(cb);
  return loom__op_finish(&c, rc, y, out);
}

/* ---- linear --------------------------------------------------------------------------- */

/* tmp[0..w) += the column sums of g's first w columns (R rows, ld apart), row by row, in
 * blocks of 64 columns summed down the rows in registers (vectorized). tmp[k] continues its
 * running sum: rows fed in pieces sum in the same order as all at once. */
__attribute__((optimize("O3"))) static void col_sums_add(const float *restrict g, int64_t R,
                                                         int64_t w, int64_t ld,
                                                         float *restrict tmp) {
  enum { W = 64 };
  for (int64_t o0 = 0; o0 < w; o0 += W) {
    float acc[W];
    int64_t c = w - o0 < W ? w - o0 : W;
    for (int64_t k = 0; k < c; k++) acc[k] = tmp[o0 + k];
    if (c == W) {
      for (int64_t r = 0; r < R; r++)
        for (int k = 0; k < W; k++) acc[k] += g[r * ld + o0 + k];
    } else {
      for (int64_t r = 0; r < R; r++)
        for (int64_t k = 0; k < c; k++) acc[k] += g[r * ld + o0 + k];
    }
    for (int64_t k = 0; k < c; k++) tmp[o0 + k] = acc[k];
  }
}

enum { SUMS_MAX = 4096 }; /* widest bias whose sums cast_col_sums keeps on the stack */

/* dst[O] (beta 0: =, 1: +=) column sums of g [R, O]: the bias gradient, each column summed
 * in row order from 0. g is read in order, a piece of rows (about 64 KiB) at a time summed
 * into running sums kept in L1 (a strip of 64 columns walked down all R rows touched a new page
 * every row at the GPT's widths), and strips of 64 columns are split over the GEMM's threads
 * (loom__gemm_threads): the same sums whatever the split. */
static void col_sums(const float *g, int64_t R, int64_t O, float *dst, float beta) {
  int64_t strips = (O + 63) / 64;
  int t = R * O >= (1 << 16) ? loom__gemm_threads() : 1;
  if (t > strips) t = (int)strips;
  (void)t; /* unused without OpenMP */
#pragma omp parallel for num_threads(t) if (t > 1)
  for (int p = 0; p < t; p++) {
    int64_t c1 = strips * (p + 1) / t * 64;
    c1 = c1 < O ? c1 : O;
    for (int64_t a = strips * p / t * 64; a < c1; a += SUMS_MAX) {
      int64_t w = c1 - a < SUMS_MAX ? c1 - a : SUMS_MAX, rows = 16384 / w > 0 ? 16384 / w : 1;
      float tmp[SUMS_MAX];
      for (int64_t k = 0; k < w; k++) tmp[k] = 0;
      for (int64_t r0 = 0; r0 < R; r0 += rows)
        col_sums_add(g + r0 * O + a, R - r0 < rows ? R - r0 : rows, w, O, tmp);
      for (int64_t k = 0; k < w; k++) dst[a + k] = beta == 0.0f ? tmp[k] : dst[a + k] + tmp[k];
    }
  }
}

/* gd = g rounded to dt (f16 / bf16) and dst (beta 0: =, 1: +=) = g's column sums, in one pass
 * over g: a piece of rows at a time is rounded and then summed while it is in cache (g is read
 * from memory once, not twice), stripes of columns over the GEMM's thread team. The same values
 * as loom_tensor_cast and col_sums. O <= SUMS_MAX. */
static void cast_col_sums(const float *g, void *gd, loom_dtype dt, int64_t R, int64_t O,
                          float *dst, float beta) {
  float tmp[SUMS_MAX] = {0};
  /* a stripe of columns per thread, whole 64-column blocks (each column's sum keeps its row
   * order, so the split changes no value): long runs of each row, for the prefetchers */
  int t = R * O >= (1 << 16) ? loom__gemm_threads() : 1;
  int64_t stripe = ((O + 63) / 64 + t - 1) / t * 64, stripes = (O + stripe - 1) / stripe;
#pragma omp parallel for num_threads(t) if (t > 1 && stripes > 1)
  for (int64_t s = 0; s < stripes; s++) {
    int64_t c0 = s * stripe, w = O - c0 < stripe ? O - c0 : stripe;
    int64_t rows = 16384 / w; /* a piece: about 64 KiB of g */
    for (int64_t r0 = 0; r0 < R; r0 += rows) {
      int64_t n = R - r0 < rows ? R - r0 : rows;
      if (w == O) loom__narrow(dt, g + r0 * O, (uint16_t *)gd + r0 * O, (size_t)(n * O));
      else
        for (int64_t r = r0; r < r0 + n; r++)
          loom__narrow(dt, g + r * O + c0, (uint16_t *)gd + r * O + c0, (size_t)w);
      col_sums_add(g + r0 * O + c0, n, w, O, tmp + c0);
    }
  }
  for (int64_t k = 0; k < O; k++) dst[k] = beta == 0.0f ? tmp[k] : dst[k] + tmp[k];
}

/* dst [O, I] (beta 0: =, 1: +=) t^T for t [I, O], in 32 x 32 blocks (the lines of both
 * stay in L1 while a block is done). */
static void transpose_into(const float *t, int64_t I, int64_t O, float *dst, float beta) {
  enum { TB = 32 };
  for (int64_t o0 = 0; o0 < O; o0 += TB)
    for (int64_t i0 = 0; i0 < I; i0 += TB) {
      int64_t o1 = O - o0 < TB ? O : o0 + TB, i1 = I - i0 < TB ? I : i0 + TB;
      for (int64_t o = o0; o < o1; o++) {
        float *d = dst + o * I;
        if (beta == 0.0f)
          for (int64_t i = i0; i < i1; i++) d[i] = t[i * O + o];
        else
          for (int64_t i = i0; i < i1; i++) d[i] += t[i * O + o];
      }
    }
}

/* linear's weight gradient: dst [O, I] (beta 0: =, 1: +=) G^T X, G [R, O] and X [R, I] in
 * dtype dt, f32 sums. An f32 one far wider than tall (O >= 64, 2 O <= I, R >= 2 I: GPT-2's MLP
 * c_proj) is computed transposed, X^T G into [I, O], then transposed into place: oneDNN 2.6's
 * TN product ran 384x1536x4096 at 102-103 GFLOP/s (CPU time, 1 thread) and the same product
 * transposed, 1536x384x4096, at 122 (`bench_matmul 1 gpt`); the copy is 1/4096 of the work. */
static int weight_grad(loom_dtype dt, int64_t O, int64_t I, int64_t R, const void *G,
                       const void *X, float *dst, float beta) {
  if (dt != LOOM_F32 || O < 64 || 2 * O > I || R < 2 * I)
    return gemm(dt, LOOM_F32, 1, O, I, R, G, true, 0, X, false, 0, dst, 0, beta);
  float *t = loom__malloc(LOOM_POOL_COMPUTE, (size_t)(I * O) * sizeof *t);
  if (!t)
    return loom__fail(LOOM_ENOMEM, "linear: out of memory for the weight gradient's transposed "
                      "product (%lld x %lld floats)", (long long)I, (long long)O);
  int rc = gemm(LOOM_F32, LOOM_F32, 1, I, O, R, X, true, 0, G, false, 0, t, 0, 0.0f);
  if (!rc && !loom__dry()) transpose_into(t, I, O, dst, beta);
  loom__free(t);
  return rc;
}

/* Tell sink s what its write added at most, r * a * b for the maxima a and b of the inputs
 * (INFINITY when one of them held inf/NaN), and account the reads of those maxima, begun at
 * t0, as the cost of tracking (loom_grad_bound_cost). */
static void bound_written(const loom__sink *s, double t0, double r, double a, double b) {
  loom__sink_bound(s, a == INFINITY || b == INFINITY ? INFINITY : r * a * b);
  loom__bound_spent(loom__now() - t0);
}

static int linear_backward(loom__node *n, loom_tensor *g, loom_tensor **gin) {
  int rc = LOOM_OK;
  const loom_tensor *x = n->saved[0], *w = n->saved[1];
  loom_dtype dt = x->dtype;
  int64_t O = w->shape[0], I = w->shape[1], R = 1;
  for (int i = 0; i < n->in[0].ndim - 1; i++) R *= n->in[0].shape[i];
  loom_tensor *gd = NULL;
  float *dst, beta;
  double gmax = -1; /* max |G| in f32, once a tracked bias or weight gradient wants it */
  bool bias = n->n_in > 2 && loom__node_needs(n, 2);
  /* a 16-bit G and the bias gradient from one pass over G */
  bool fused = bias && dt != LOOM_F32 && O <= SUMS_MAX && loom_tensor_is_contiguous(g);
  if (fused) LOOM_TRY(loom_tensor_empty(dt, g->ndim, g->shape, &gd));
  else LOOM_TRY(grad_as(g, dt, &gd));
  /* the parameters' gradients first, each finished as soon as it is written (its hooks run
   * then: DDP launches its bucket while gX is still being computed) */
  loom__sink sb = {0}, sw = {0};
  if (bias) { /* gb = column sums of G, while G is in cache */
    LOOM_TRY(loom__grad_dst_sink(n, 2, gin, &dst, &beta, &sb));
    if (!loom__dry() && fused)
      cast_col_sums(loom__f(g), loom_tensor_data(gd), dt, R, O, dst, beta);
    else if (!loom__dry())
      col_sums(loom__f(g), R, O, dst, beta);
    if (sb.bound_wanted) { /* each sum adds at most R * max|G| */
      double t0 = loom__now();
      gmax = loom__absmax(loom__f(g), LOOM_F32, (size_t)(R * O));
      bound_written(&sb, t0, (double)R, gmax, 1.0);
    }
  }
  if (loom__node_needs(n, 1)) { /* gW [O, I] = G^T [O, R] X [R, I] */
    LOOM_TRY(loom__grad_dst_sink(n, 1, gin, &dst, &beta, &sw));
    LOOM_TRY(weight_grad(dt, O, I, R, loom_tensor_data(gd), loom_tensor_data(x), dst, beta));
    if (sw.bound_wanted) { /* each element adds at most R * max|X| * max|G| (as the GEMM saw
                              them, in dt); an inf/NaN in either makes a column or row non-finite */
      double t0 = loom__now();
      double gm = dt == LOOM_F32 && gmax >= 0 ? gmax
                                              : loom__absmax(loom_tensor_data(gd), dt, (size_t)(R * O));
      double xm = loom__absmax(loom_tensor_data(x), dt, (size_t)(R * I));
      bound_written(&sw, t0, (double)R, xm, gm);
    }
  }
  LOOM_TRY(loom__sink_finish(n, 2, &sb));
  LOOM_TRY(loom__sink_finish(n, 1, &sw));
  if (loom__node_needs(n, 0)) { /* gX [R, I] = G [R, O] W [O, I] */
    LOOM_TRY(loom__grad_dst(n, 0, gin, &dst, &beta));
    LOOM_TRY(gemm(dt, LOOM_F32, 1, R, I, O, loom_tensor_data(gd), false, 0, loom_tensor_data(w),
                  false, 0, dst, 0, beta));
  }
done:
  loom_tensor_free(gd);
  return rc;
}

int loom_linear(loom_tensor *x, loom_tensor *w, loom_tensor *b, loom_tensor **out) {
  static const char *name = "linear";
  int rc = loom__check_out(name, out);
  if (rc) return rc;
  if ((rc = loom__check_float(name, x, "x")) || (rc = loom__check_float(name, w, "w")) ||
      (b && (rc = loom__check_float(name, b, "b"))))
    return rc;
  loom__op c;
  loom_tensor *in[3] = {x, w, b}, *cx = NULL, *cw = NULL, *y = NULL;
  loom__fbuf fb = {0};
  loom__node *nd = NULL;
  char s1[96], s2[96];
  if ((rc = loom__op_begin(&c, LOOM_OPK_LINEAR, in, b ? 3 : 2))) return rc;
  x = c.in[0];
  w = c.in[1];
  b = b ? c.in[2] : NULL;
  LOOM_TRY(loom__check_same_dtype(name, x, w));
  if (b) LOOM_TRY(loom__check_same_dtype(name, x, b));
  if (w->ndim != 2 || x->ndim < 1 || x->shape[x->ndim - 1] != w->shape[1]) {
    rc = loom__fail(LOOM_ESHAPE, "%s: x %s and weight %s do not match (weight is [out, in])",
                    name, loom__shape_str(x->ndim, x->shape, s1, sizeof s1),
                    loom__shape_str(w->ndim, w->shape, s2, sizeof s2));
    goto done;
  }
  int64_t O = w->shape[0], I = w->shape[1];
  if (b && (b->ndim != 1 || b->shape[0] != O)) {
    rc = loom__fail(LOOM_ESHAPE, "%s: bias %s does not match %lld outputs", name,
                    loom__shape_str(b->ndim, b->shape, s1, sizeof s1), (long long)O);
    goto done;
  }
  int64_t shape[LOOM_MAX_DIMS];
  memcpy(shape, x->shape, (size_t)x->ndim * sizeof *shape);
  shape[x->ndim - 1] = O;
  int64_t R = 1;
  for (int i = 0; i < x->ndim - 1; i++) R *= x->shape[i];
  LOOM_TRY(loom_tensor_contiguous(x, &cx));
  LOOM_TRY(loom_tensor_contiguous(w, &cw));
  /* straight into y in its dtype: the f32 sum plus the f32 bias, rounded once */
  LOOM_TRY(loom_tensor_empty(x->dtype, x->ndim, shape, &y));
  if (b) LOOM_TRY(loom__f32_in(b, &fb));
  LOOM_TRY(gemm_bias(x->dtype, x->dtype, 1, R, O, I, loom_tensor_data(cx), false, 0,
                     loom_tensor_data(cw), true, 0, loom_tensor_data(y), 0, 0.0f,
                     b ? fb.p : NULL));
  LOOM_TRY(loom__op_record(&c, y, linear_backward, &nd));
  if (nd) {
    LOOM_TRY(loom__node_save(nd, 0, cx));
    LOOM_TRY(loom__node_save(nd, 1, cw));
  }
done:
  loom__fbuf_free(&fb);
  loom_tensor_free(cx);
  loom_tensor_free(cw);
  return loom__op_finish(&c, rc, y, out);
}
