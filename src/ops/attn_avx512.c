/* attn_avx512.c: fused attention's inner loops (attn_body.h) on 16-lane AVX-512 vectors.
 * Built with -mavx512f -mfma (CMakeLists.txt). */
#include "ops/attn_int.h"

#include <immintrin.h>

/* exp of each lane: x = n ln2 + r, |r| <= ln2 / 2, exp(r) by Cephes' expf polynomial, times 2^n
 * with scalef (which goes to 0 and inf where the result leaves the range); NaN stays NaN. */
static inline __m512 exp_avx512(__m512 x) {
  x = _mm512_max_ps(_mm512_set1_ps(-104.0f), _mm512_min_ps(_mm512_set1_ps(89.0f), x));
  __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                  _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), x);
  r = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.12194440e-4f), r);
  __m512 y = _mm512_set1_ps(1.9875691500e-4f);
  y = _mm512_fmadd_ps(y, r, _mm512_set1_ps(1.3981999507e-3f));
  y = _mm512_fmadd_ps(y, r, _mm512_set1_ps(8.3334519073e-3f));
  y = _mm512_fmadd_ps(y, r, _mm512_set1_ps(4.1665795894e-2f));
  y = _mm512_fmadd_ps(y, r, _mm512_set1_ps(1.6666665459e-1f));
  y = _mm512_fmadd_ps(y, r, _mm512_set1_ps(5.0000001201e-1f));
  y = _mm512_fmadd_ps(y, _mm512_mul_ps(r, r), _mm512_add_ps(r, _mm512_set1_ps(1.0f)));
  return _mm512_scalef_ps(y, n);
}

#define AV __m512
#define AW 16
#define AV_LOAD _mm512_loadu_ps
#define AV_STORE _mm512_storeu_ps
#define AV_FMA _mm512_fmadd_ps
#define AV_SET1 _mm512_set1_ps
#define AV_ZERO _mm512_setzero_ps
#define AV_HSUM _mm512_reduce_add_ps
#define AV_ADD _mm512_add_ps
#define AV_EXP exp_avx512
#define AV_MAX _mm512_max_ps
#define AV_HMAX _mm512_reduce_max_ps
#define ATTN_TABLE loom__attn_kernels_avx512
#include "ops/attn_body.h"
