/* attn_body.h: fused attention's inner loops (attn_int.h) written once over a vector type,
 * included by attn_avx2.c and attn_avx512.c, which define it first: AV (the vector type), AW
 * (its float lanes), AV_LOAD, AV_STORE, AV_FMA(a, b, c) = a * b + c, AV_FNMA(a, b, c) =
 * c - a * b, AV_SET1, AV_ZERO, AV_ADD, AV_MUL, AV_ROUND (to nearest), AV_HSUM (the sum of the
 * lanes), AV_MAX(a, b) (b where either is NaN), AV_HMAX (the largest lane), AV_NV4 (vectors of
 * each row accum4 keeps in registers: 4 rows x AV_NV4 accumulators plus AV_NV4 loaded ones must
 * fit the register file) and ATTN_TABLE (the table's name); and after it av_exp (exp of each lane, from exp_reduced below and the level's
 * own 2^n). Ragged ends of a row run as scalar loops. No include guard on purpose. */

static inline AV av_exp(AV x);

/* exp(x) = 2^n exp(r): n = round(x log2 e) (in *n), r = x - n ln2 (ln2 in two parts, so r is
 * exact), |r| <= ln2 / 2, and exp(r) by Cephes' expf polynomial (within 2 ulp of expf). */
static inline AV exp_reduced(AV x, AV *n) {
  *n = AV_ROUND(AV_MUL(x, AV_SET1(1.44269504088896341f)));
  AV r = AV_FNMA(*n, AV_SET1(0.693359375f), x);
  r = AV_FNMA(*n, AV_SET1(-2.12194440e-4f), r);
  AV y = AV_SET1(1.9875691500e-4f);
  y = AV_FMA(y, r, AV_SET1(1.3981999507e-3f));
  y = AV_FMA(y, r, AV_SET1(8.3334519073e-3f));
  y = AV_FMA(y, r, AV_SET1(4.1665795894e-2f));
  y = AV_FMA(y, r, AV_SET1(1.6666665459e-1f));
  y = AV_FMA(y, r, AV_SET1(5.0000001201e-1f));
  return AV_FMA(y, AV_MUL(r, r), AV_ADD(r, AV_SET1(1.0f)));
}

static float dot(const float *x, const float *y, size_t D) {
  size_t Dv = D / AW * AW;
  AV a = AV_ZERO();
  for (size_t d = 0; d < Dv; d += AW) a = AV_FMA(AV_LOAD(x + d), AV_LOAD(y + d), a);
  float r = AV_HSUM(a);
  for (size_t d = Dv; d < D; d++) r += x[d] * y[d];
  return r;
}

/* The output row held in registers four vectors at a time while the block's rows stream by,
 * two rows a step into two sets of accumulators (eight independent FMA chains: enough to
 * cover the FMA latency on two ports). */
static void accum(float *o, const float *p, const float *v, size_t ld, size_t n, size_t D) {
  size_t d = 0;
  for (; d + 4 * AW <= D; d += 4 * AW) {
    AV o0 = AV_LOAD(o + d), o1 = AV_LOAD(o + d + AW), o2 = AV_LOAD(o + d + 2 * AW),
       o3 = AV_LOAD(o + d + 3 * AW), e0 = AV_ZERO(), e1 = AV_ZERO(), e2 = AV_ZERO(),
       e3 = AV_ZERO();
    size_t j = 0;
    for (; j + 2 <= n; j += 2) {
      const float *vj = v + j * ld + d, *vk = vj + ld;
      AV pj = AV_SET1(p[j]), pk = AV_SET1(p[j + 1]);
      o0 = AV_FMA(pj, AV_LOAD(vj), o0);
      o1 = AV_FMA(pj, AV_LOAD(vj + AW), o1);
      o2 = AV_FMA(pj, AV_LOAD(vj + 2 * AW), o2);
      o3 = AV_FMA(pj, AV_LOAD(vj + 3 * AW), o3);
      e0 = AV_FMA(pk, AV_LOAD(vk), e0);
      e1 = AV_FMA(pk, AV_LOAD(vk + AW), e1);
      e2 = AV_FMA(pk, AV_LOAD(vk + 2 * AW), e2);
      e3 = AV_FMA(pk, AV_LOAD(vk + 3 * AW), e3);
    }
    if (j < n) {
      const float *vj = v + j * ld + d;
      AV pj = AV_SET1(p[j]);
      o0 = AV_FMA(pj, AV_LOAD(vj), o0);
      o1 = AV_FMA(pj, AV_LOAD(vj + AW), o1);
      o2 = AV_FMA(pj, AV_LOAD(vj + 2 * AW), o2);
      o3 = AV_FMA(pj, AV_LOAD(vj + 3 * AW), o3);
    }
    AV_STORE(o + d, AV_ADD(o0, e0));
    AV_STORE(o + d + AW, AV_ADD(o1, e1));
    AV_STORE(o + d + 2 * AW, AV_ADD(o2, e2));
    AV_STORE(o + d + 3 * AW, AV_ADD(o3, e3));
  }
  for (; d + AW <= D; d += AW) {
    AV o0 = AV_LOAD(o + d);
    for (size_t j = 0; j < n; j++) o0 = AV_FMA(AV_SET1(p[j]), AV_LOAD(v + j * ld + d), o0);
    AV_STORE(o + d, o0);
  }
  for (; d < D; d++)
    for (size_t j = 0; j < n; j++) o[d] += p[j] * v[j * ld + d];
}

/* accum for two output rows at once: four vectors of each in registers (eight FMA chains),
 * each row of the block loaded once for both. */
static void accum2(float *o0, float *o1, const float *p0, const float *p1, const float *v,
                   size_t ld, size_t n, size_t D) {
  size_t d = 0;
  for (; d + 4 * AW <= D; d += 4 * AW) {
    AV a0 = AV_LOAD(o0 + d), a1 = AV_LOAD(o0 + d + AW), a2 = AV_LOAD(o0 + d + 2 * AW),
       a3 = AV_LOAD(o0 + d + 3 * AW), b0 = AV_LOAD(o1 + d), b1 = AV_LOAD(o1 + d + AW),
       b2 = AV_LOAD(o1 + d + 2 * AW), b3 = AV_LOAD(o1 + d + 3 * AW);
    for (size_t j = 0; j < n; j++) {
      const float *vj = v + j * ld + d;
      AV x = AV_SET1(p0[j]), y = AV_SET1(p1[j]), v0 = AV_LOAD(vj), v1 = AV_LOAD(vj + AW),
         v2 = AV_LOAD(vj + 2 * AW), v3 = AV_LOAD(vj + 3 * AW);
      a0 = AV_FMA(x, v0, a0);
      b0 = AV_FMA(y, v0, b0);
      a1 = AV_FMA(x, v1, a1);
      b1 = AV_FMA(y, v1, b1);
      a2 = AV_FMA(x, v2, a2);
      b2 = AV_FMA(y, v2, b2);
      a3 = AV_FMA(x, v3, a3);
      b3 = AV_FMA(y, v3, b3);
    }
    AV_STORE(o0 + d, a0);
    AV_STORE(o0 + d + AW, a1);
    AV_STORE(o0 + d + 2 * AW, a2);
    AV_STORE(o0 + d + 3 * AW, a3);
    AV_STORE(o1 + d, b0);
    AV_STORE(o1 + d + AW, b1);
    AV_STORE(o1 + d + 2 * AW, b2);
    AV_STORE(o1 + d + 3 * AW, b3);
  }
  if (d < D) { /* the rest of the row, one output at a time */
    accum(o0 + d, p0, v + d, ld, n, D - d);
    accum(o1 + d, p1, v + d, ld, n, D - d);
  }
}

/* An empty asm that says it changes x: the loaded vector stays in a register, where the
 * compiler would otherwise fold the load into each of the four FMAs that use it (four loads
 * where one does, and the load ports, not the FMAs, would set the speed). */
#define AV_KEEP(x) __asm__("" : "+v"(x))

/* Four output rows by AV_NV4 vectors in registers; each vector of a block row is loaded once
 * for the four FMAs of the tile's rows (on AVX-512: 16 FMAs to 4 loads and 4 broadcasts). */
static void accum4(float *const o[4], const float *const p[4], size_t ps, const float *v,
                   size_t ld, size_t n, size_t D) {
  size_t d = 0;
  for (; d + AV_NV4 * AW <= D; d += AV_NV4 * AW) {
    AV acc[4][AV_NV4];
#pragma GCC unroll 4
    for (int r = 0; r < 4; r++)
#pragma GCC unroll 4
      for (int c = 0; c < AV_NV4; c++) acc[r][c] = AV_LOAD(o[r] + d + c * AW);
    const float *p0 = p[0], *p1 = p[1], *p2 = p[2], *p3 = p[3];
    for (size_t j = 0; j < n; j++) {
      const float *vj = v + j * ld + d;
      AV x[AV_NV4];
#pragma GCC unroll 4
      for (int c = 0; c < AV_NV4; c++) {
        x[c] = AV_LOAD(vj + c * AW);
        AV_KEEP(x[c]);
      }
      size_t jp = j * ps;
      AV b0 = AV_SET1(p0[jp]), b1 = AV_SET1(p1[jp]), b2 = AV_SET1(p2[jp]), b3 = AV_SET1(p3[jp]);
#pragma GCC unroll 4
      for (int c = 0; c < AV_NV4; c++) {
        acc[0][c] = AV_FMA(b0, x[c], acc[0][c]);
        acc[1][c] = AV_FMA(b1, x[c], acc[1][c]);
        acc[2][c] = AV_FMA(b2, x[c], acc[2][c]);
        acc[3][c] = AV_FMA(b3, x[c], acc[3][c]);
      }
    }
#pragma GCC unroll 4
    for (int r = 0; r < 4; r++)
#pragma GCC unroll 4
      for (int c = 0; c < AV_NV4; c++) AV_STORE(o[r] + d + c * AW, acc[r][c]);
  }
  for (int r = 0; r < 4; r++) { /* the rest of each row: a vector, then a float, at a time */
    size_t e = d;
    for (; e + AW <= D; e += AW) {
      AV acc = AV_LOAD(o[r] + e);
      for (size_t j = 0; j < n; j++)
        acc = AV_FMA(AV_SET1(p[r][j * ps]), AV_LOAD(v + j * ld + e), acc);
      AV_STORE(o[r] + e, acc);
    }
    for (; e < D; e++)
      for (size_t j = 0; j < n; j++) o[r][e] += p[r][j * ps] * v[j * ld + e];
  }
}

/* An 8 x 8 block of src (rows ls apart) into dst transposed (rows ld apart), scaled, through
 * registers: AVX's unpack / shuffle / 128-bit permute network (AVX2 and AVX-512 alike). */
static inline void tr8(float *d, size_t ld, const float *s, size_t ls, __m256 sc) {
  __m256 r[8], t[8], u[8];
  for (int i = 0; i < 8; i++) r[i] = _mm256_mul_ps(sc, _mm256_loadu_ps(s + i * ls));
  for (int i = 0; i < 8; i += 2) {
    t[i] = _mm256_unpacklo_ps(r[i], r[i + 1]);
    t[i + 1] = _mm256_unpackhi_ps(r[i], r[i + 1]);
  }
  for (int i = 0; i < 8; i += 4) {
    u[i] = _mm256_shuffle_ps(t[i], t[i + 2], 0x44);
    u[i + 1] = _mm256_shuffle_ps(t[i], t[i + 2], 0xEE);
    u[i + 2] = _mm256_shuffle_ps(t[i + 1], t[i + 3], 0x44);
    u[i + 3] = _mm256_shuffle_ps(t[i + 1], t[i + 3], 0xEE);
  }
  for (int i = 0; i < 4; i++) {
    _mm256_storeu_ps(d + i * ld, _mm256_permute2f128_ps(u[i], u[i + 4], 0x20));
    _mm256_storeu_ps(d + (i + 4) * ld, _mm256_permute2f128_ps(u[i], u[i + 4], 0x31));
  }
}

static void transpose(float *dst, size_t ldd, const float *src, size_t lds, size_t R, size_t C,
                      float scale) {
  size_t R8 = R / 8 * 8, C8 = C / 8 * 8;
  __m256 sc = _mm256_set1_ps(scale);
  for (size_t r = 0; r < R8; r += 8)
    for (size_t c = 0; c < C8; c += 8) tr8(dst + c * ldd + r, ldd, src + r * lds + c, lds, sc);
  for (size_t r = 0; r < R; r++) /* the ragged edges */
    for (size_t c = r < R8 ? C8 : 0; c < C; c++) dst[c * ldd + r] = scale * src[r * lds + c];
}

static float expsum(float *p, const float *s, size_t n, float m) {
  size_t j = 0;
  AV acc = AV_ZERO();
  for (; j + AW <= n; j += AW) {
    AV e = av_exp(AV_ADD(AV_LOAD(s + j), AV_SET1(-m)));
    AV_STORE(p + j, e);
    acc = AV_ADD(acc, e);
  }
  float sum = AV_HSUM(acc);
  for (; j < n; j++) sum += (p[j] = expf(s[j] - m));
  return sum;
}

static float max(const float *s, size_t n, float m) {
  size_t j = 0;
  AV acc = AV_SET1(m);
  for (; j + AW <= n; j += AW) acc = AV_MAX(AV_LOAD(s + j), acc); /* a NaN lane keeps acc */
  m = AV_HMAX(acc);
  for (; j < n; j++) m = s[j] > m ? s[j] : m;
  return m;
}

const loom__attn_kernels ATTN_TABLE = {
    .dot = dot, .accum = accum, .accum2 = accum2, .accum4 = accum4, .transpose = transpose, .expsum = expsum, .max = max};
