/* unary_body.h: the unary kernels' loops and their table loom__unary_kernels_<level>, included
 * by unary_scalar.c, unary_avx2.c and unary_avx512.c with UNARY_SFX set, each compiled with its
 * level's ISA flags (CMakeLists.txt), so each level is the same source compiled for its
 * instruction set. No include guard on purpose. */
#define UK_CAT2(a, b) a##_##b
#define UK_CAT(a, b) UK_CAT2(a, b)
#define UK(name) UK_CAT(name, UNARY_SFX)

/* tanh of one float in straight-line code the vectorizer turns into SIMD (the SIMD levels'
 * UNARY_TANH; the scalar level, the reference, defines UNARY_TANH as libm's tanhf).
 * |x| < 0.625: Cephes' tanhf polynomial x + x^3 P(x^2); else 1 - 2 / (exp(2|x|) + 1) with the
 * sign of x, exp(a) = 2^n exp(r) (n = round(a log2 e), r = a - n ln2 with ln2 in two parts,
 * Cephes' expf polynomial), 2|x| capped at 20 (tanh rounds to 1 from |x| = 9.01). A NaN takes
 * the polynomial branch and stays NaN; +-inf give +-1; -0 stays -0. Within 3 ulp of glibc's
 * tanhf on every float (tests/ops/test_unary_levels.c measures it). */
static inline float UK(tanh_approx)(float x) {
  float a = fabsf(x), z = x * x;
  float p = -5.70498872745e-3f;
  p = p * z + 2.06390887954e-2f;
  p = p * z - 5.37397155531e-2f;
  p = p * z + 1.33314422036e-1f;
  p = p * z - 3.33332819422e-1f;
  float small = copysignf(p * z * x + x, x); /* -0 stays -0 */
  float e2 = 2.0f * a < 20.0f ? 2.0f * a : 20.0f;
  float n = (e2 * 1.44269504088896341f + 12582912.0f) - 12582912.0f; /* round to nearest */
  float r = e2 - n * 0.693359375f;
  r = r + n * 2.12194440e-4f;
  float q = 1.9875691500e-4f;
  q = q * r + 1.3981999507e-3f;
  q = q * r + 8.3334519073e-3f;
  q = q * r + 4.1665795894e-2f;
  q = q * r + 1.6666665459e-1f;
  q = q * r + 5.0000001201e-1f;
  q = q * (r * r) + (r + 1.0f);
  int32_t bits = ((int32_t)n + 127) << 23;
  float s;
  memcpy(&s, &bits, sizeof s);
  float big = copysignf(1.0f - 2.0f / (q * s + 1.0f), x);
  return !(a >= 0.625f) ? small : big;
}
#ifndef UNARY_TANH
#define UNARY_TANH(x) UK(tanh_approx)(x)
#endif

static void UK(f_neg)(float *y, const float *x, size_t n, float p) {
  for (size_t i = 0; i < n; i++) y[i] = -x[i];
}
static void UK(b_neg)(float *gx, const float *g, const float *x, const float *y, size_t n,
                      double p) {
  for (size_t i = 0; i < n; i++) gx[i] = -g[i];
}
static void UK(f_relu)(float *y, const float *x, size_t n, float p) {
  for (size_t i = 0; i < n; i++) y[i] = x[i] > 0.0f ? x[i] : 0.0f;
}
static void UK(b_relu)(float *gx, const float *g, const float *x, const float *y, size_t n,
                       double p) {
  for (size_t i = 0; i < n; i++) gx[i] = y[i] > 0.0f ? g[i] : 0.0f;
}
static void UK(f_gelu)(float *y, const float *x, size_t n, float p) {
  for (size_t i = 0; i < n; i++) y[i] = 0.5f * x[i] * (1.0f + erff(x[i] * (float)M_SQRT1_2));
}
static void UK(b_gelu)(float *gx, const float *g, const float *x, const float *y, size_t n,
                       double p) {
  const float k = 0.3989422804014327f; /* 1/sqrt(2 pi) */
  for (size_t i = 0; i < n; i++) {
    float v = x[i];
    float cdf = 0.5f * (1.0f + erff(v * (float)M_SQRT1_2));
    gx[i] = g[i] * (cdf + v * k * expf(-0.5f * v * v));
  }
}
/* GELU (tanh form) of one element, and g times its derivative: the one definition the f32
 * loops and the bf16-direct loops below share, so both give the same floats. */
static inline float UK(gelu_tanh1)(float v) {
  const float c = 0.7978845608028654f; /* sqrt(2/pi) */
  return 0.5f * v * (1.0f + UNARY_TANH(c * (v + 0.044715f * v * v * v)));
}
static inline float UK(gelu_tanh_d1)(float g, float v) {
  const float c = 0.7978845608028654f;
  float t = UNARY_TANH(c * (v + 0.044715f * v * v * v));
  float du = c * (1.0f + 3.0f * 0.044715f * v * v);
  return g * (0.5f * (1.0f + t) + 0.5f * v * (1.0f - t * t) * du);
}
static void UK(f_gelu_tanh)(float *y, const float *x, size_t n, float p) {
  for (size_t i = 0; i < n; i++) y[i] = UK(gelu_tanh1)(x[i]);
}
static void UK(b_gelu_tanh)(float *gx, const float *g, const float *x, const float *y, size_t n,
                            double p) {
  for (size_t i = 0; i < n; i++) gx[i] = UK(gelu_tanh_d1)(g[i], x[i]);
}

/* bf16 <-> f32 of one element in straight-line code the vectorizer widens in registers: the
 * same bits as the core's conversions (cvt_scalar.c's loom__ref_bf16_to_f32 / _f32_to_bf16:
 * exact widening; nearest-even rounding, a NaN made quiet). */
static inline float UK(bf16_f32)(uint16_t h) {
  uint32_t b = (uint32_t)h << 16;
  float f;
  memcpy(&f, &b, sizeof f);
  return f;
}
static inline uint16_t UK(f32_bf16)(float f) {
  uint32_t x;
  memcpy(&x, &f, sizeof x);
  uint32_t r = (x + 0x7fffu + ((x >> 16) & 1u)) >> 16, q = (x >> 16) | 0x0040u;
  return (uint16_t)((x & 0x7fffffffu) > 0x7f800000u ? q : r);
}

/* GELU (tanh form) straight on bf16 x (forward: bf16 y; backward: f32 gx = g * gelu'(x)),
 * widening and rounding in registers: the same values as widening x to f32, running
 * f_gelu_tanh / b_gelu_tanh and rounding y, without the staging buffers. */
static void UK(f_gelu_tanh_bf16)(uint16_t *y, const uint16_t *x, size_t n) {
  for (size_t i = 0; i < n; i++) y[i] = UK(f32_bf16)(UK(gelu_tanh1)(UK(bf16_f32)(x[i])));
}
static void UK(b_gelu_tanh_bf16)(float *gx, const float *g, const uint16_t *x, size_t n) {
  for (size_t i = 0; i < n; i++) gx[i] = UK(gelu_tanh_d1)(g[i], UK(bf16_f32)(x[i]));
}
static void UK(f_tanh)(float *y, const float *x, size_t n, float p) {
  for (size_t i = 0; i < n; i++) y[i] = UNARY_TANH(x[i]);
}
static void UK(b_tanh)(float *gx, const float *g, const float *x, const float *y, size_t n,
                       double p) {
  for (size_t i = 0; i < n; i++) gx[i] = g[i] * (1.0f - y[i] * y[i]);
}
static void UK(f_sigmoid)(float *y, const float *x, size_t n, float p) {
  for (size_t i = 0; i < n; i++) y[i] = 1.0f / (1.0f + expf(-x[i]));
}
static void UK(b_sigmoid)(float *gx, const float *g, const float *x, const float *y, size_t n,
                          double p) {
  for (size_t i = 0; i < n; i++) gx[i] = g[i] * y[i] * (1.0f - y[i]);
}
static void UK(f_exp)(float *y, const float *x, size_t n, float p) {
  for (size_t i = 0; i < n; i++) y[i] = expf(x[i]);
}
static void UK(b_exp)(float *gx, const float *g, const float *x, const float *y, size_t n,
                      double p) {
  for (size_t i = 0; i < n; i++) gx[i] = g[i] * y[i];
}
static void UK(f_log)(float *y, const float *x, size_t n, float p) {
  for (size_t i = 0; i < n; i++) y[i] = logf(x[i]);
}
static void UK(b_log)(float *gx, const float *g, const float *x, const float *y, size_t n,
                      double p) {
  for (size_t i = 0; i < n; i++) gx[i] = g[i] / x[i];
}
static void UK(f_sqrt)(float *y, const float *x, size_t n, float p) {
  for (size_t i = 0; i < n; i++) y[i] = sqrtf(x[i]);
}
static void UK(b_sqrt)(float *gx, const float *g, const float *x, const float *y, size_t n,
                       double p) {
  for (size_t i = 0; i < n; i++) gx[i] = g[i] * 0.5f / y[i];
}
static void UK(f_pow)(float *y, const float *x, size_t n, float p) {
  if (p == 2.0f) {
    for (size_t i = 0; i < n; i++) y[i] = x[i] * x[i];
  } else {
    for (size_t i = 0; i < n; i++) y[i] = powf(x[i], p);
  }
}
static void UK(b_pow)(float *gx, const float *g, const float *x, const float *y, size_t n,
                      double p) {
  float pf = (float)p;
  if (pf == 2.0f) {
    for (size_t i = 0; i < n; i++) gx[i] = g[i] * 2.0f * x[i];
  } else {
    for (size_t i = 0; i < n; i++) gx[i] = g[i] * pf * powf(x[i], pf - 1.0f);
  }
}
static void UK(f_add_scalar)(float *y, const float *x, size_t n, float p) {
  for (size_t i = 0; i < n; i++) y[i] = x[i] + p;
}
static void UK(b_add_scalar)(float *gx, const float *g, const float *x, const float *y,
                             size_t n, double p) {
  for (size_t i = 0; i < n; i++) gx[i] = g[i];
}
static void UK(f_mul_scalar)(float *y, const float *x, size_t n, float p) {
  for (size_t i = 0; i < n; i++) y[i] = x[i] * p;
}
static void UK(b_mul_scalar)(float *gx, const float *g, const float *x, const float *y,
                             size_t n, double p) {
  float pf = (float)p;
  for (size_t i = 0; i < n; i++) gx[i] = g[i] * pf;
}
static void UK(f_div_scalar)(float *y, const float *x, size_t n, float p) {
  for (size_t i = 0; i < n; i++) y[i] = x[i] / p;
}
static void UK(b_div_scalar)(float *gx, const float *g, const float *x, const float *y,
                             size_t n, double p) {
  float pf = (float)p;
  for (size_t i = 0; i < n; i++) gx[i] = g[i] / pf;
}

/* x > 0 on f16/bf16 bits: positive as a signed 16-bit integer (sign clear, not zero) and not
 * a NaN (above +inf). */
static void UK(relu16)(uint16_t *y, const uint16_t *x, size_t n, uint16_t inf) {
  for (size_t i = 0; i < n; i++) y[i] = (int16_t)x[i] > 0 && x[i] <= inf ? x[i] : 0;
}
static void UK(relu16_bwd)(float *gx, const float *g, const uint16_t *y, size_t n,
                           uint16_t inf) {
  for (size_t i = 0; i < n; i++) gx[i] = (int16_t)y[i] > 0 && y[i] <= inf ? g[i] : 0.0f;
}

const loom__unary_kernels_t UK(loom__unary_kernels) = {
    .fwd = {UK(f_neg), UK(f_relu), UK(f_gelu), UK(f_gelu_tanh), UK(f_tanh), UK(f_sigmoid),
            UK(f_exp), UK(f_log), UK(f_sqrt), UK(f_pow), UK(f_add_scalar), UK(f_mul_scalar),
            UK(f_div_scalar)},
    .bwd = {UK(b_neg), UK(b_relu), UK(b_gelu), UK(b_gelu_tanh), UK(b_tanh), UK(b_sigmoid),
            UK(b_exp), UK(b_log), UK(b_sqrt), UK(b_pow), UK(b_add_scalar), UK(b_mul_scalar),
            UK(b_div_scalar)},
    .relu16 = UK(relu16),
    .relu16_bwd = UK(relu16_bwd),
    .gelu_tanh_bf16 = UK(f_gelu_tanh_bf16),
    .gelu_tanh_bf16_bwd = UK(b_gelu_tanh_bf16),
};

#undef UNARY_TANH
#undef UK
#undef UK_CAT
#undef UK_CAT2
