/* kernels_avx2.c: the optimizer kernels on AVX2, 8 floats at a time, bit-identical to
 * kernels_scalar.c: the same operations in the same order, no FMA (built with -mavx2 alone,
 * CMakeLists.txt, so the compiler cannot fuse), and the ragged tail handed to the scalar
 * kernel. */
#include "optim/optim_int.h"

#include <immintrin.h>

static void adam_avx2(const loom__adam_args *a, float *p, const float *g, float *m,
                           float *v, size_t n) {
  const __m256 b1 = _mm256_set1_ps(a->beta1), omb1 = _mm256_set1_ps(a->omb1);
  const __m256 b2 = _mm256_set1_ps(a->beta2), omb2 = _mm256_set1_ps(a->omb2);
  const __m256 wd = _mm256_set1_ps(a->wd), decay = _mm256_set1_ps(a->decay);
  const __m256 bc2 = _mm256_set1_ps(a->bc2_sqrt), eps = _mm256_set1_ps(a->eps);
  const __m256 ns = _mm256_set1_ps(a->neg_step), sign = _mm256_set1_ps(-0.0f);
  const __m256 gs = _mm256_set1_ps(a->grad_scale);
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    __m256 gi = _mm256_loadu_ps(g + i);
    __m256 pi = _mm256_loadu_ps(p + i);
    if (a->scaled) gi = _mm256_mul_ps(gi, gs);
    if (a->maximize) gi = _mm256_xor_ps(gi, sign);
    if (a->l2) gi = _mm256_add_ps(gi, _mm256_mul_ps(wd, pi));
    if (a->decoupled) pi = _mm256_mul_ps(pi, decay);
    __m256 mi = _mm256_mul_ps(_mm256_loadu_ps(m + i), b1);
    mi = _mm256_add_ps(mi, _mm256_mul_ps(omb1, gi));
    __m256 vi = _mm256_mul_ps(_mm256_loadu_ps(v + i), b2);
    vi = _mm256_add_ps(vi, _mm256_mul_ps(_mm256_mul_ps(omb2, gi), gi));
    __m256 d = _mm256_add_ps(_mm256_div_ps(_mm256_sqrt_ps(vi), bc2), eps);
    pi = _mm256_add_ps(pi, _mm256_div_ps(_mm256_mul_ps(ns, mi), d));
    _mm256_storeu_ps(p + i, pi);
    _mm256_storeu_ps(m + i, mi);
    _mm256_storeu_ps(v + i, vi);
  }
  loom__adam_scalar(a, p + i, g + i, m + i, v + i, n - i);
}

static void sgd_avx2(const loom__sgd_args *a, float *p, const float *g, float *buf,
                          size_t n) {
  const __m256 wd = _mm256_set1_ps(a->wd), mom = _mm256_set1_ps(a->momentum);
  const __m256 omd = _mm256_set1_ps(a->omd), nlr = _mm256_set1_ps(a->neg_lr);
  const __m256 sign = _mm256_set1_ps(-0.0f), gs = _mm256_set1_ps(a->grad_scale);
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    __m256 d = _mm256_loadu_ps(g + i);
    __m256 pi = _mm256_loadu_ps(p + i);
    if (a->scaled) d = _mm256_mul_ps(d, gs);
    if (a->maximize) d = _mm256_xor_ps(d, sign);
    if (a->has_wd) d = _mm256_add_ps(d, _mm256_mul_ps(wd, pi));
    if (a->has_momentum) {
      __m256 b = d;
      if (!a->first)
        b = _mm256_add_ps(_mm256_mul_ps(_mm256_loadu_ps(buf + i), mom), _mm256_mul_ps(omd, d));
      _mm256_storeu_ps(buf + i, b);
      d = a->nesterov ? _mm256_add_ps(d, _mm256_mul_ps(mom, b)) : b;
    }
    _mm256_storeu_ps(p + i, _mm256_add_ps(pi, _mm256_mul_ps(nlr, d)));
  }
  loom__sgd_scalar(a, p + i, g + i, buf ? buf + i : NULL, n - i);
}

/* Lanes 0-3, 4-7, 8-11, 12-15 in four registers; squares of f32 are exact in double. */
static void sumsq_avx2(double lane[16], const float *x, size_t n) {
  __m256d acc[4];
  for (int k = 0; k < 4; k++) acc[k] = _mm256_loadu_pd(lane + 4 * k);
  size_t i = 0;
  for (; i + 16 <= n; i += 16)
    for (int k = 0; k < 4; k++) {
      __m256d d = _mm256_cvtps_pd(_mm_loadu_ps(x + i + 4 * k));
      acc[k] = _mm256_add_pd(acc[k], _mm256_mul_pd(d, d));
    }
  for (int k = 0; k < 4; k++) _mm256_storeu_pd(lane + 4 * k, acc[k]);
  loom__sumsq_lanes(lane, x + i, n - i, i);
}

static void scale_avx2(float *x, float s, size_t n) {
  const __m256 vs = _mm256_set1_ps(s);
  size_t i = 0;
  for (; i + 8 <= n; i += 8) _mm256_storeu_ps(x + i, _mm256_mul_ps(_mm256_loadu_ps(x + i), vs));
  loom__scale_scalar(x + i, s, n - i);
}

const loom__optim_kernels loom__optim_kernels_avx2 = {
    .adam = adam_avx2,
    .sgd = sgd_avx2,
    .sumsq = sumsq_avx2,
    .scale = scale_avx2,
};
