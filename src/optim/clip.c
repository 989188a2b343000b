/* clip.c: global L2 gradient-norm clipping with torch.nn.utils.clip_grad_norm_'s semantics,
 * split into its parts (sum of squares, coefficient, scale) so a sharded caller can all-reduce
 * the sum of squares between them. */
#include "optim/optim_int.h"

#include <math.h>

double loom_grad_sumsq(const float *g, size_t n) {
  if (!g || !n) return 0.0;
  return loom__optim_k()->sumsq(g, n);
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

int loom_clip_grad_norm(const loom_param_seg *segs, size_t nseg, double max_norm,
                        bool error_if_nonfinite, float *total_norm) {
  if (nseg && !segs) return loom__fail(LOOM_EINVAL, "loom_clip_grad_norm: segs is NULL");
  if (!(max_norm >= 0) || !isfinite(max_norm))
    return loom__fail(LOOM_EINVAL, "loom_clip_grad_norm: max_norm = %g must be finite and >= 0",
                      max_norm);
  for (size_t i = 0; i < nseg; i++)
    if (segs[i].n && !segs[i].grad)
      return loom__fail(LOOM_EINVAL, "loom_clip_grad_norm: segment %zu has a NULL grad", i);
  double sum = 0.0;
  for (size_t i = 0; i < nseg; i++) sum += loom_grad_sumsq(segs[i].grad, segs[i].n);
  float total = (float)sqrt(sum);
  if (total_norm) *total_norm = total;
  if (!isfinite(total) && error_if_nonfinite)
    return loom__fail(LOOM_EINVAL,
                      "loom_clip_grad_norm: total norm is %s; gradients left unclipped",
                      isnan(total) ? "nan" : "inf");
  float coef = loom_clip_coef(total, max_norm);
  for (size_t i = 0; i < nseg; i++) loom_grad_scale((float *)segs[i].grad, segs[i].n, coef);
  return LOOM_OK;
}
