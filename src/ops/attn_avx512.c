/* attn_avx512.c: fused attention's inner loops (attn_body.h) on 16-lane AVX-512 vectors.
 * Built with -mavx512f -mfma (CMakeLists.txt). */
#include "ops/attn_int.h"

#include <immintrin.h>

#define AV __m512
#define AW 16
#define AV_LOAD _mm512_loadu_ps
#define AV_STORE _mm512_storeu_ps
#define AV_FMA _mm512_fmadd_ps
#define AV_FNMA _mm512_fnmadd_ps
#define AV_SET1 _mm512_set1_ps
#define AV_ZERO _mm512_setzero_ps
#define AV_HSUM _mm512_reduce_add_ps
#define AV_ADD _mm512_add_ps
#define AV_MUL _mm512_mul_ps
#define AV_ROUND(x) _mm512_roundscale_ps(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC)
#define AV_MAX _mm512_max_ps
#define AV_HMAX _mm512_reduce_max_ps
#define AV_NV4 4
#define ATTN_TABLE loom__attn_kernels_avx512
#include "ops/attn_body.h"

/* 2^n by scalef, which goes to 0 and inf where the result leaves the range. */
static inline __m512 av_exp(__m512 x) {
  __m512 n;
  x = _mm512_max_ps(_mm512_set1_ps(-104.0f), _mm512_min_ps(_mm512_set1_ps(89.0f), x)); /* NaN kept */
  __m512 y = exp_reduced(x, &n);
  return _mm512_scalef_ps(y, n);
}
