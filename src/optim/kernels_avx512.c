/* kernels_avx512.c: the optimizer kernels on AVX-512F, 16 floats at a time, bit-identical to
 * kernels_scalar.c. AVX-512F has FMA, so multiplies and adds use the explicit-rounding forms
 * (round to nearest, which is what MXCSR holds anyway): those are builtins the compiler never
 * contracts into a fused multiply-add. The ragged tail goes to the scalar kernel. Built with
 * -mavx512f (CMakeLists.txt). */
#include "optim/optim_int.h"

#include <immintrin.h>

#define RN (_MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC)

static inline __m512 mul(__m512 a, __m512 b) { return _mm512_mul_round_ps(a, b, RN); }
static inline __m512 add(__m512 a, __m512 b) { return _mm512_add_round_ps(a, b, RN); }
static inline __m512 dvd(__m512 a, __m512 b) { return _mm512_div_round_ps(a, b, RN); }
static inline __m512 neg(__m512 a) {
  return _mm512_castsi512_ps(
      _mm512_xor_si512(_mm512_castps_si512(a), _mm512_set1_epi32((int)0x80000000u)));
}

static void adam_avx512(const loom__adam_args *a, float *p, const float *g, float *m,
                               float *v, size_t n) {
  const __m512 b1 = _mm512_set1_ps(a->beta1), omb1 = _mm512_set1_ps(a->omb1);
  const __m512 b2 = _mm512_set1_ps(a->beta2), omb2 = _mm512_set1_ps(a->omb2);
  const __m512 wd = _mm512_set1_ps(a->wd), decay = _mm512_set1_ps(a->decay);
  const __m512 bc2 = _mm512_set1_ps(a->bc2_sqrt), eps = _mm512_set1_ps(a->eps);
  const __m512 ns = _mm512_set1_ps(a->neg_step), gs = _mm512_set1_ps(a->grad_scale);
  size_t i = 0;
  for (; i + 16 <= n; i += 16) {
    __m512 gi = _mm512_loadu_ps(g + i);
    __m512 pi = _mm512_loadu_ps(p + i);
    if (a->scaled) gi = mul(gi, gs);
    if (a->maximize) gi = neg(gi);
    if (a->l2) gi = add(gi, mul(wd, pi));
    if (a->decoupled) pi = mul(pi, decay);
    __m512 mi = add(mul(_mm512_loadu_ps(m + i), b1), mul(omb1, gi));
    __m512 vi = add(mul(_mm512_loadu_ps(v + i), b2), mul(mul(omb2, gi), gi));
    __m512 d = add(dvd(_mm512_sqrt_round_ps(vi, RN), bc2), eps);
    pi = add(pi, dvd(mul(ns, mi), d));
    _mm512_storeu_ps(p + i, pi);
    _mm512_storeu_ps(m + i, mi);
    _mm512_storeu_ps(v + i, vi);
  }
  loom__adam_scalar(a, p + i, g + i, m + i, v + i, n - i);
}

static void sgd_avx512(const loom__sgd_args *a, float *p, const float *g, float *buf,
                              size_t n) {
  const __m512 wd = _mm512_set1_ps(a->wd), mom = _mm512_set1_ps(a->momentum);
  const __m512 omd = _mm512_set1_ps(a->omd), nlr = _mm512_set1_ps(a->neg_lr);
  const __m512 gs = _mm512_set1_ps(a->grad_scale);
  size_t i = 0;
  for (; i + 16 <= n; i += 16) {
    __m512 d = _mm512_loadu_ps(g + i);
    __m512 pi = _mm512_loadu_ps(p + i);
    if (a->scaled) d = mul(d, gs);
    if (a->maximize) d = neg(d);
    if (a->has_wd) d = add(d, mul(wd, pi));
    if (a->has_momentum) {
      __m512 b = a->first ? d : add(mul(_mm512_loadu_ps(buf + i), mom), mul(omd, d));
      _mm512_storeu_ps(buf + i, b);
      d = a->nesterov ? add(d, mul(mom, b)) : b;
    }
    _mm512_storeu_ps(p + i, add(pi, mul(nlr, d)));
  }
  loom__sgd_scalar(a, p + i, g + i, buf ? buf + i : NULL, n - i);
}

/* Lanes 0-7 and 8-15 in two registers; squares of f32 are exact in double, so the fused
 * multiply-add rounds exactly as the scalar multiply-then-add. */
static void sumsq_avx512(double lane[16], const float *x, size_t n) {
  __m512d lo = _mm512_loadu_pd(lane), hi = _mm512_loadu_pd(lane + 8);
  size_t i = 0;
  for (; i + 16 <= n; i += 16) {
    __m512d a = _mm512_cvtps_pd(_mm256_loadu_ps(x + i));
    __m512d b = _mm512_cvtps_pd(_mm256_loadu_ps(x + i + 8));
    lo = _mm512_fmadd_pd(a, a, lo);
    hi = _mm512_fmadd_pd(b, b, hi);
  }
  _mm512_storeu_pd(lane, lo);
  _mm512_storeu_pd(lane + 8, hi);
  loom__sumsq_lanes(lane, x + i, n - i, i);
}

static void scale_avx512(float *x, float s, size_t n) {
  const __m512 vs = _mm512_set1_ps(s);
  size_t i = 0;
  for (; i + 16 <= n; i += 16) _mm512_storeu_ps(x + i, mul(_mm512_loadu_ps(x + i), vs));
  loom__scale_scalar(x + i, s, n - i);
}

const loom__optim_kernels loom__optim_kernels_avx512 = {
    .adam = adam_avx512,
    .sgd = sgd_avx512,
    .sumsq = sumsq_avx512,
    .scale = scale_avx512,
};
