/* kernels_scalar.c: the scalar reference of the optimizer kernels (Adam/AdamW, SGD, sum of
 * squares, scale). The SIMD levels must give exactly these bits, so every expression is
 * written as separate f32 operations (this file is built without FMA, so none is fused). */
#include "optim/optim_int.h"

#include <math.h>

void loom__adam_scalar(const loom__adam_args *a, float *p, const float *g, float *m, float *v,
                       size_t n) {
  for (size_t i = 0; i < n; i++) {
    float gi = a->scaled ? g[i] * a->grad_scale : g[i];
    if (a->maximize) gi = -gi;
    float pi = p[i];
    if (a->l2) gi = gi + a->wd * pi;
    if (a->decoupled) pi = pi * a->decay;
    float mi = m[i] * a->beta1;
    mi = mi + a->omb1 * gi;
    float vi = v[i] * a->beta2;
    vi = vi + (a->omb2 * gi) * gi;
    float d = sqrtf(vi) / a->bc2_sqrt + a->eps;
    p[i] = pi + (a->neg_step * mi) / d;
    m[i] = mi;
    v[i] = vi;
  }
}

void loom__sgd_scalar(const loom__sgd_args *a, float *p, const float *g, float *buf, size_t n) {
  for (size_t i = 0; i < n; i++) {
    float d = a->scaled ? g[i] * a->grad_scale : g[i];
    if (a->maximize) d = -d;
    if (a->has_wd) d = d + a->wd * p[i];
    if (a->has_momentum) {
      float b = a->first ? d : buf[i] * a->momentum + a->omd * d;
      buf[i] = b;
      d = a->nesterov ? d + a->momentum * b : b;
    }
    p[i] = p[i] + a->neg_lr * d;
  }
}

void loom__scale_scalar(float *x, float s, size_t n) {
  for (size_t i = 0; i < n; i++) x[i] = x[i] * s;
}

void loom__sumsq_lanes(double lane[16], const float *x, size_t n, size_t start) {
  for (size_t i = 0; i < n; i++) {
    double d = (double)x[i];
    lane[(start + i) & 15] += d * d; /* exact product: f32 squared fits in a double */
  }
}

double loom__sumsq_fold(double lane[16]) {
  for (int half = 8; half >= 1; half /= 2)
    for (int i = 0; i < half; i++) lane[i] += lane[i + half];
  return lane[0];
}

static void sumsq_scalar(double lane[16], const float *x, size_t n) {
  loom__sumsq_lanes(lane, x, n, 0);
}

const loom__optim_kernels loom__optim_kernels_scalar = {
    .adam = loom__adam_scalar,
    .sgd = loom__sgd_scalar,
    .sumsq = sumsq_scalar,
    .scale = loom__scale_scalar,
};
