/* dropout.c: inverted dropout with a counter-based mask: element i is kept when
 * loom_rng_hash(seed, i) is at or above p * 2^64, so the mask depends only on (seed, i) and
 * backward regenerates it instead of storing it. */
#include "loom/rng.h"
#include "ops/ops_int.h"

#include <math.h>

static bool keep(uint64_t seed, size_t i, double p) {
  return (double)loom_rng_hash(seed, i) >= p * 18446744073709551616.0;
}

static void apply(float *y, const float *x, size_t n, uint64_t seed, double p) {
  float scale = (float)(1.0 / (1.0 - p));
  for (size_t i = 0; i < n; i++) y[i] = keep(seed, i, p) ? x[i] * scale : 0.0f;
}

static int dropout_backward(loom__node *n, loom_tensor *g, loom_tensor **gin) {
  int rc = loom__grad_new(n->in[0].ndim, n->in[0].shape, false, &gin[0]);
  if (!rc) apply(loom__f(gin[0]), loom__f(g), loom_tensor_numel(g), (uint64_t)n->i[0], n->f[0]);
  return rc;
}

int loom_dropout(loom_tensor *x, double p, uint64_t seed, bool train, loom_tensor **out) {
  static const char *name = "dropout";
  int rc = loom__check_out(name, out);
  if (rc) return rc;
  if ((rc = loom__check_float(name, x, "x"))) return rc;
  if (!(p >= 0 && p < 1))
    return loom__fail(LOOM_EINVAL, "%s: p = %g is outside [0, 1)", name, p);
  if (!train || p == 0) return loom_mul_scalar(x, 1.0, out);
  loom__op c;
  loom_tensor *y = NULL;
  loom__fbuf fx = {0}, fy = {0};
  loom__node *nd = NULL;
  if ((rc = loom__op_begin(&c, LOOM_OPK_DROPOUT, &x, 1))) return rc;
  x = c.in[0];
  LOOM_TRY(loom__f32_in(x, &fx));
  LOOM_TRY(loom__f32_out(x->dtype, x->ndim, x->shape, &y, &fy));
  apply(fy.p, fx.p, loom_tensor_numel(x), seed, p);
  loom__f32_out_commit(y, &fy);
  LOOM_TRY(loom__op_record(&c, y, dropout_backward, &nd));
  if (nd) {
    nd->i[0] = (int64_t)seed;
    nd->f[0] = p;
  }
done:
  loom__fbuf_free(&fx);
  loom__fbuf_free(&fy);
  return loom__op_finish(&c, rc, y, out);
}
