/* gemm_check.c: argument validation of the GEMM and convolution kernels, shared by the
 * oneDNN kernels and their scalar references so both reject the same inputs with the same
 * messages. */
#include "ops/gemm_int.h"

static bool float_dtype(loom_dtype dt) {
  return dt == LOOM_F32 || dt == LOOM_BF16 || dt == LOOM_F16;
}

static int positive(const char *who, const char *name, int64_t v) {
  if (v >= 1) return LOOM_OK;
  return loom__fail(LOOM_EINVAL, "%s: %s must be positive, got %lld", who, name, (long long)v);
}

/* An operand stored as rows x cols with row stride ld, and `batch` of them `stride` apart. */
static int operand(const char *who, const char *name, const void *p, int64_t rows, int64_t cols,
                   int64_t ld, int64_t batch, int64_t stride, bool is_output) {
  if (!p) return loom__fail(LOOM_EINVAL, "%s: %s is NULL", who, name);
  if (ld < cols)
    return loom__fail(LOOM_ESHAPE,
                      "%s: leading dimension %lld of %s is less than its row length %lld", who,
                      (long long)ld, name, (long long)cols);
  if (batch == 1) return LOOM_OK;
  int64_t span = (rows - 1) * ld + cols;
  if (stride < 0 || (is_output && stride < span))
    return loom__fail(LOOM_ESHAPE,
                      "%s: batch stride %lld of %s is %s (one %lldx%lld matrix with leading "
                      "dimension %lld spans %lld elements)",
                      who, (long long)stride, name,
                      stride < 0 ? "negative" : "too small to keep batches apart", (long long)rows,
                      (long long)cols, (long long)ld, (long long)span);
  return LOOM_OK;
}

int loom__gemm_check(const loom__gemm_args *g, const char *who) {
  int rc = LOOM_OK;
  if (!g) return loom__fail(LOOM_EINVAL, "%s: args is NULL", who);
  LOOM_TRY(positive(who, "batch", g->batch));
  LOOM_TRY(positive(who, "M", g->M));
  LOOM_TRY(positive(who, "N", g->N));
  LOOM_TRY(positive(who, "K", g->K));
  if (!float_dtype(g->ab_dtype))
    return loom__fail(LOOM_EDTYPE, "%s: A and B dtype %s is not supported (f32, bf16 or f16)", who,
                      loom_dtype_name(g->ab_dtype));
  if (g->c_dtype != LOOM_F32 && g->c_dtype != g->ab_dtype)
    return loom__fail(LOOM_EDTYPE, "%s: C dtype %s is not supported with %s inputs (f32 or %s)",
                      who, loom_dtype_name(g->c_dtype), loom_dtype_name(g->ab_dtype),
                      loom_dtype_name(g->ab_dtype));
  if (g->beta != 0.0f && g->beta != 1.0f)
    return loom__fail(LOOM_EINVAL, "%s: beta must be 0 or 1, got %g", who, (double)g->beta);
  if (g->bias && g->alpha != 1.0f)
    return loom__fail(LOOM_EINVAL, "%s: a bias needs alpha 1, got %g", who, (double)g->alpha);
  LOOM_TRY(operand(who, "A", g->A, g->trans_a ? g->K : g->M, g->trans_a ? g->M : g->K, g->lda,
                   g->batch, g->stride_a, false));
  LOOM_TRY(operand(who, "B", g->B, g->trans_b ? g->N : g->K, g->trans_b ? g->K : g->N, g->ldb,
                   g->batch, g->stride_b, false));
  LOOM_TRY(operand(who, "C", g->C, g->M, g->N, g->ldc, g->batch, g->stride_c, true));
done:
  return rc;
}

int loom__conv2d_check(const loom__conv2d_args *a, const char *who, const void *p1, const char *n1,
                       const void *p2, const char *n2, const void *p3, const char *n3) {
  int rc = LOOM_OK;
  if (!a) return loom__fail(LOOM_EINVAL, "%s: args is NULL", who);
  const void *ps[3] = {p1, p2, p3};
  const char *ns[3] = {n1, n2, n3};
  for (int i = 0; i < 3; i++)
    if (!ps[i]) return loom__fail(LOOM_EINVAL, "%s: %s is NULL", who, ns[i]);
  const int64_t v[] = {a->N, a->C, a->H, a->W, a->O, a->KH, a->KW, a->stride_h, a->stride_w};
  const char *names[] = {"N", "C", "H", "W", "O", "KH", "KW", "stride_h", "stride_w"};
  for (int i = 0; i < 9; i++) LOOM_TRY(positive(who, names[i], v[i]));
  if (a->pad_h < 0 || a->pad_w < 0)
    return loom__fail(LOOM_EINVAL, "%s: padding must not be negative, got %lld x %lld", who,
                      (long long)a->pad_h, (long long)a->pad_w);
  if (a->H + 2 * a->pad_h < a->KH || a->W + 2 * a->pad_w < a->KW)
    return loom__fail(LOOM_ESHAPE,
                      "%s: kernel %lld x %lld is larger than the padded input %lld x %lld", who,
                      (long long)a->KH, (long long)a->KW, (long long)(a->H + 2 * a->pad_h),
                      (long long)(a->W + 2 * a->pad_w));
  if (!float_dtype(a->dtype))
    return loom__fail(LOOM_EDTYPE, "%s: dtype %s is not supported (f32, bf16 or f16)", who,
                      loom_dtype_name(a->dtype));
done:
  return rc;
}
