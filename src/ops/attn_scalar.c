/* attn_scalar.c: fused attention's inner loops (attn_int.h), the scalar reference every SIMD
 * level is tested against: plain loops, built with -fno-tree-vectorize (CMakeLists.txt). The
 * level pickers live here. */
#include "ops/attn_int.h"

static float dot(const float *x, const float *y, size_t D) {
  float r = 0;
  for (size_t d = 0; d < D; d++) r += x[d] * y[d];
  return r;
}

static void accum(float *o, const float *p, const float *v, size_t ld, size_t n, size_t D) {
  for (size_t j = 0; j < n; j++)
    for (size_t d = 0; d < D; d++) o[d] += p[j] * v[j * ld + d];
}

static void accum2(float *o0, float *o1, const float *p0, const float *p1, const float *v,
                   size_t ld, size_t n, size_t D) {
  accum(o0, p0, v, ld, n, D);
  accum(o1, p1, v, ld, n, D);
}

static void accum4(float *const o[4], const float *const p[4], size_t ps, const float *v,
                   size_t ld, size_t n, size_t D) {
  for (int r = 0; r < 4; r++)
    for (size_t j = 0; j < n; j++)
      for (size_t d = 0; d < D; d++) o[r][d] += p[r][j * ps] * v[j * ld + d];
}

static void transpose(float *dst, size_t ldd, const float *src, size_t lds, size_t R, size_t C,
                      float scale) {
  for (size_t r = 0; r < R; r++)
    for (size_t c = 0; c < C; c++) dst[c * ldd + r] = scale * src[r * lds + c];
}

static float expsum(float *p, const float *s, size_t n, float m) {
  float sum = 0;
  for (size_t j = 0; j < n; j++) sum += (p[j] = expf(s[j] - m));
  return sum;
}

static float max(const float *s, size_t n, float m) {
  for (size_t j = 0; j < n; j++) m = s[j] > m ? s[j] : m;
  return m;
}

const loom__attn_kernels loom__attn_kernels_scalar = {
    .dot = dot, .accum = accum, .accum2 = accum2, .accum4 = accum4, .transpose = transpose, .expsum = expsum, .max = max};

LOOM__KERNEL_PICKERS(loom__attn_kernels, loom__attn_kernels, loom__attn_kernels_for,
                     loom__attn_k)
