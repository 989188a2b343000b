/* clip.c: global L2 gradient-norm clipping with torch.nn.utils.clip_grad_norm_'s semantics,
 * split into its parts (sum of squares, coefficient, scale) so a sharded caller can all-reduce
 * the sum of squares between them; and its deferred form for gradients still multiplied by a
 * loss scale (the coefficient folded into the optimizer's grad_scale, no pass that writes). */
#include "optim/optim_int.h"

#include <math.h>

void loom__sumsq_add(double lane[16], const float *x, size_t n, size_t start) {
  size_t head = (16 - start % 16) % 16;
  if (head > n) head = n;
  loom__sumsq_lanes(lane, x, head, start);
  if (n > head) loom__optim_k()->sumsq(lane, x + head, n - head);
}

double loom_grad_sumsq(const float *g, size_t n) {
  if (!g || !n) return 0.0;
  double lane[16] = {0};
  loom__sumsq_add(lane, g, n, 0);
  return loom__sumsq_fold(lane);
}

void loom_grad_scale(float *g, size_t n, float coef) {
  if (!g || !n) return;
  loom__optim_k()->scale(g, coef, n);
}

/* PyTorch: clip_coef = max_norm / (total_norm + 1e-6), where a Python number divided by a
 * tensor is reciprocal(tensor) * number, all in f32; then clamp(max=1) (NaN stays NaN). */
float loom_clip_coef(float total_norm, double max_norm) {
  float t = total_norm + 1e-6f;
  float coef = (1.0f / t) * (float)max_norm;
  return coef > 1.0f ? 1.0f : coef;
}

/* The common part: arguments, the global norm of the stored gradients times inv_scale (exact
 * when inv_scale is a power of two), the nonfinite rule and the coefficient. */
static int norm_coef(const char *who, const loom_param_seg *segs, size_t nseg, double max_norm,
                     float inv_scale, bool error_if_nonfinite, float *total_norm, float *coef) {
  if (nseg && !segs) return loom__fail(LOOM_EINVAL, "%s: segs is NULL", who);
  if (!(max_norm >= 0) || !isfinite(max_norm))
    return loom__fail(LOOM_EINVAL, "%s: max_norm = %g must be finite and >= 0", who, max_norm);
  if (!(inv_scale > 0) || !isfinite(inv_scale))
    return loom__fail(LOOM_EINVAL, "%s: inv_scale = %g must be finite and > 0", who,
                      (double)inv_scale);
  for (size_t i = 0; i < nseg; i++)
    if (segs[i].n && !segs[i].grad)
      return loom__fail(LOOM_EINVAL, "%s: segment %zu has a NULL grad", who, i);
  double sum = 0.0;
  for (size_t i = 0; i < nseg; i++) sum += loom_grad_sumsq(segs[i].grad, segs[i].n);
  float total = (float)sqrt(sum) * inv_scale;
  if (total_norm) *total_norm = total;
  if (!isfinite(total) && error_if_nonfinite)
    return loom__fail(LOOM_EINVAL, "%s: total norm is %s; gradients left unclipped", who,
                      isnan(total) ? "nan" : "inf");
  *coef = loom_clip_coef(total, max_norm);
  return LOOM_OK;
}

int loom_clip_grad_norm(const loom_param_seg *segs, size_t nseg, double max_norm,
                        bool error_if_nonfinite, float *total_norm) {
  float coef = 1.0f;
  int rc = norm_coef("loom_clip_grad_norm", segs, nseg, max_norm, 1.0f, error_if_nonfinite,
                     total_norm, &coef);
  if (rc) return rc;
  for (size_t i = 0; i < nseg; i++) loom_grad_scale((float *)segs[i].grad, segs[i].n, coef);
  return LOOM_OK;
}

int loom_clip_grad_norm_scaled(const loom_param_seg *segs, size_t nseg, double max_norm,
                               float inv_scale, bool error_if_nonfinite, float *total_norm,
                               float *grad_scale) {
  static const char *who = "loom_clip_grad_norm_scaled";
  if (!grad_scale) return loom__fail(LOOM_EINVAL, "%s: grad_scale is NULL", who);
  float coef = 1.0f;
  int rc = norm_coef(who, segs, nseg, max_norm, inv_scale, error_if_nonfinite, total_norm, &coef);
  if (rc) return rc;
  *grad_scale = inv_scale * coef;
  return LOOM_OK;
}
