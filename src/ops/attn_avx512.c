/* attn_avx512.c: fused attention's inner loops (attn_body.h) on 16-lane AVX-512 vectors.
 * Built with -mavx512f -mfma (CMakeLists.txt). */
#include "ops/attn_int.h"

#include <immintrin.h>

#define AV __m512
#define AW 16
#define AV_LOAD _mm512_loadu_ps
#define AV_STORE _mm512_storeu_ps
#define AV_FMA _mm512_fmadd_ps
#define AV_SET1 _mm512_set1_ps
#define AV_ZERO _mm512_setzero_ps
#define AV_HSUM _mm512_reduce_add_ps
#define ATTN_TABLE loom__attn_kernels_avx512
#include "ops/attn_body.h"
