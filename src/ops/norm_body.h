/* norm_body.h: layer norm's loops (norm_int.h) and their table loom__norm_kernels_<level>,
 * included by norm_scalar.c, norm_avx2.c and norm_avx512.c with NORM_SFX set, each compiled
 * with its level's flags (CMakeLists.txt). A row's sums run in NL = 16 lanes (one AVX-512
 * vector, two AVX2 ones), added lane by lane at the end, the same order at every level. No
 * include guard on purpose. */
#define NK_CAT2(a, b) a##_##b
#define NK_CAT(a, b) NK_CAT2(a, b)
#define NK(name) NK_CAT(name, NORM_SFX)

enum { NL = 16 };

/* The sum of x[i] - m (sq 0) or of (x[i] - m)^2 (sq 1). */
static float NK(sum_dev)(const float *x, size_t n, float m, int sq) {
  float acc[NL] = {0}, s = 0;
  size_t i = 0;
  if (sq)
    for (; i + NL <= n; i += NL)
      for (int l = 0; l < NL; l++) acc[l] += (x[i + l] - m) * (x[i + l] - m);
  else
    for (; i + NL <= n; i += NL)
      for (int l = 0; l < NL; l++) acc[l] += x[i + l];
  for (int l = 0; l < NL; l++) s += acc[l];
  for (; i < n; i++) s += sq ? (x[i] - m) * (x[i] - m) : x[i];
  return s;
}

/* Asks for row r + 1 of x (C floats) while row r is worked on: forward reads each row three
 * times (its two sums, then the result), and out of cache the next one arrives by then (on the
 * Xeon of issue 27, forward 1.25x faster out of cache). Values are unchanged. */
static inline void NK(prefetch_row)(const float *x, size_t r, size_t r1, size_t C) {
  if (r + 1 >= r1) return;
  const char *p = (const char *)(x + (r + 1) * C);
  for (size_t b = 0; b < C * sizeof(float); b += 64) __builtin_prefetch(p + b);
}

static void NK(fwd)(float *y, float *stats, const float *x, const float *w, const float *b,
                    size_t r0, size_t r1, size_t C, float eps) {
  for (size_t r = r0; r < r1; r++) {
    const float *xr = x + r * C;
    float *yr = y + r * C;
    NK(prefetch_row)(x, r, r1, C);
    float mean = NK(sum_dev)(xr, C, 0, 0) / (float)C;
    float var = NK(sum_dev)(xr, C, mean, 1) / (float)C;
    float rstd = 1.0f / sqrtf(var + eps);
    if (w && b)
      for (size_t i = 0; i < C; i++) yr[i] = (xr[i] - mean) * rstd * w[i] + b[i];
    else
      for (size_t i = 0; i < C; i++)
        yr[i] = (xr[i] - mean) * rstd * (w ? w[i] : 1.0f) + (b ? b[i] : 0.0f);
    stats[2 * r] = mean;
    stats[2 * r + 1] = rstd;
  }
}

static void NK(bwd_dx)(float *dx, const float *dy, const float *x, const float *w,
                       const float *stats, size_t r0, size_t r1, size_t C) {
  for (size_t r = r0; r < r1; r++) {
    const float *xr = x + r * C, *g = dy + r * C;
    float *d = dx + r * C, mean = stats[2 * r], rstd = stats[2 * r + 1];
    float a1[NL] = {0}, a2[NL] = {0}, m1 = 0, m2 = 0;
    size_t i = 0;
    for (; i + NL <= C; i += NL)
      for (int l = 0; l < NL; l++) {
        float dn = g[i + l] * (w ? w[i + l] : 1.0f);
        a1[l] += dn;
        a2[l] += dn * ((xr[i + l] - mean) * rstd);
      }
    for (int l = 0; l < NL; l++) m1 += a1[l], m2 += a2[l];
    for (; i < C; i++) {
      float dn = g[i] * (w ? w[i] : 1.0f);
      m1 += dn;
      m2 += dn * ((xr[i] - mean) * rstd);
    }
    m1 /= (float)C;
    m2 /= (float)C;
    for (i = 0; i < C; i++) {
      float dn = g[i] * (w ? w[i] : 1.0f), norm = (xr[i] - mean) * rstd;
      d[i] = rstd * (dn - m1 - norm * m2);
    }
  }
}

/* dw, db (either may be NULL) += columns [i0, i0 + w) of the sums over R rows, w <= 64, the
 * running sums kept in registers (a constant w: the 64-column case) and each column summed in
 * row order from its value in dw / db, as a row-by-row read-modify-write of dw and db would. */
static inline __attribute__((always_inline)) void NK(dwb_cols)(float *dw, float *db,
                                                             const float *dy, const float *x,
                                                             const float *stats, size_t R,
                                                             size_t C, size_t i0, size_t w) {
  float aw[64], ab[64];
  for (size_t k = 0; k < w; k++) aw[k] = dw ? dw[i0 + k] : 0, ab[k] = db ? db[i0 + k] : 0;
  for (size_t r = 0; r < R; r++) {
    const float *xr = x + r * C + i0, *g = dy + r * C + i0;
    float mean = stats[2 * r], rstd = stats[2 * r + 1];
    for (size_t k = 0; k < w; k++) {
      aw[k] += g[k] * ((xr[k] - mean) * rstd);
      ab[k] += g[k];
    }
  }
  for (size_t k = 0; dw && k < w; k++) dw[i0 + k] = aw[k];
  for (size_t k = 0; db && k < w; k++) db[i0 + k] = ab[k];
}

static void NK(bwd_dwb)(float *dw, float *db, const float *dy, const float *x,
                        const float *stats, size_t R, size_t C, size_t c0, size_t c1) {
  for (size_t i0 = c0; i0 < c1; i0 += 64) {
    if (c1 - i0 >= 64) NK(dwb_cols)(dw, db, dy, x, stats, R, C, i0, 64);
    else NK(dwb_cols)(dw, db, dy, x, stats, R, C, i0, c1 - i0);
  }
}

const loom__norm_kernels NK(loom__norm_kernels) = {
    .fwd = NK(fwd), .bwd_dx = NK(bwd_dx), .bwd_dwb = NK(bwd_dwb)};

#undef NK
#undef NK_CAT
#undef NK_CAT2
