/* test_unscale.c: the fused unscale + inf/NaN check and the early-exit check. The scalar
 * reference against the public one-value conversions; every dispatch level against the scalar
 * reference, bit for bit and flag for flag, for f32, f16 and bf16 at ragged lengths and
 * misaligned starts with random, subnormal and overflowing values; an inf, -inf or NaN at every
 * position (vector bodies, block boundaries, tails), also in buffers large enough to be
 * walked as several streams; and the buffer / tensor-list API with its errors (strided views,
 * NULL entries, bad dtypes, bad inverse scales). */
#include "lt.h"
#include "amp/amp_int.h"
#include "core/kernels/kernels.h"

#include <math.h>
#include <stdlib.h>

static uint32_t rs = 2463534242u;
static uint32_t rnd(void) {
  rs ^= rs << 13;
  rs ^= rs >> 17;
  rs ^= rs << 5;
  return rs;
}

static float bits_f(uint32_t u) {
  float f;
  memcpy(&f, &u, 4);
  return f;
}

/* Finite values of every kind: ordinary, tiny (subnormal after unscaling), huge (overflowing a
 * 16-bit format after unscaling by an inverse > 1), zeros of both signs. */
static float finite_value(void) {
  switch (rnd() % 6) {
  case 0: return ((int)(rnd() % 2001) - 1000) * 0.37f;
  case 1: return bits_f((rnd() & 0x807fffffu) | ((rnd() % 30 + 1) << 23)); /* tiny normal */
  case 2: return bits_f(rnd() & 0x807fffffu);                              /* subnormal */
  case 3: return (rnd() & 1 ? 1 : -1) * (float)(rnd() % 70000);            /* near f16 max */
  case 4: return bits_f((rnd() & 0x807fffffu) | ((rnd() % 254 + 1) << 23)); /* any normal */
  default: return rnd() & 1 ? 0.0f : -0.0f;
  }
}

/* n finite values of dtype dt into buf (f16/bf16 rounded from finite f32; one that rounds to
 * inf is replaced by 1). */
static void fill(void *buf, loom_dtype dt, size_t n) {
  for (size_t i = 0; i < n; i++) {
    float v = finite_value();
    if (dt == LOOM_F32) ((float *)buf)[i] = v;
    else if (dt == LOOM_F16) {
      uint16_t h = loom_f32_to_f16(v);
      ((uint16_t *)buf)[i] = (h & 0x7c00) == 0x7c00 ? 0x3c00 : h;
    } else {
      uint16_t h = loom_f32_to_bf16(v);
      ((uint16_t *)buf)[i] = (h & 0x7f80) == 0x7f80 ? 0x3f80 : h;
    }
  }
}

static void put(void *buf, loom_dtype dt, size_t i, float v) {
  if (dt == LOOM_F32) ((float *)buf)[i] = v;
  else if (dt == LOOM_F16) ((uint16_t *)buf)[i] = loom_f32_to_f16(v);
  else ((uint16_t *)buf)[i] = loom_f32_to_bf16(v);
}

static bool k_unscale(const loom__amp_kernels *k, loom_dtype dt, void *x, size_t n, float inv) {
  return dt == LOOM_F32   ? k->unscale_f32(x, n, inv)
         : dt == LOOM_F16 ? k->unscale_f16(x, n, inv)
                          : k->unscale_bf16(x, n, inv);
}

static bool k_check(const loom__amp_kernels *k, loom_dtype dt, const void *x, size_t n) {
  return dt == LOOM_F32   ? k->nonfinite_f32(x, n)
         : dt == LOOM_F16 ? k->nonfinite_f16(x, n)
                          : k->nonfinite_bf16(x, n);
}

static const loom_dtype dts[3] = {LOOM_F32, LOOM_F16, LOOM_BF16};

LT_TEST(unscale_scalar_reference_matches_one_value_conversions) {
  float invs[4] = {1.0f / 65536, 1.0f / 3, 2.0f, 0.001f};
  for (int t = 0; t < 20000; t++) {
    float inv = invs[t % 4];
    float f = finite_value();
    float x = f;
    bool bad = loom__amp_kernels_scalar.unscale_f32(&x, 1, inv);
    float want32 = f * inv;
    LT_EQ(memcmp(&x, &want32, 4), 0);
    LT_EQ(bad, !isfinite(f * inv));
    uint16_t h = loom_f32_to_f16(f), h0 = h;
    bad = loom__amp_kernels_scalar.unscale_f16(&h, 1, inv);
    uint16_t want = loom_f32_to_f16(loom_f16_to_f32(h0) * inv);
    LT_EQ_HEX(h, want);
    LT_EQ(bad, !isfinite(loom_f16_to_f32(want)));
    uint16_t b = loom_f32_to_bf16(f), b0 = b;
    bad = loom__amp_kernels_scalar.unscale_bf16(&b, 1, inv);
    LT_EQ_HEX(b, loom_f32_to_bf16(loom_bf16_to_f32(b0) * inv));
    LT_EQ(bad, !isfinite(loom_bf16_to_f32(b)));
    if (lt_failures()) break;
  }
  /* a finite f16 that unscaling pushes past 65504 is found as inf */
  uint16_t big = loom_f32_to_f16(60000);
  LT_TRUE(loom__amp_kernels_scalar.unscale_f16(&big, 1, 2.0f));
  LT_EQ_HEX(big, 0x7c00);
}

/* Every level this CPU has (scalar included, as a self-check). */
static int levels(const loom__amp_kernels **k, const char **names) {
  int n = 0;
  for (int l = 0; l < LOOM_CPU_LEVEL_COUNT; l++)
    if (loom_cpu_supports((loom_cpu_level)l)) {
      k[n] = loom__amp_kernels_for((loom_cpu_level)l);
      names[n++] = loom_cpu_level_name((loom_cpu_level)l);
    }
  return n;
}

/* Level k (named name) against scalar on n values of dt at src + off (filled here) unscaled by
 * inv: a and b get the two results, *flag the scalar's flag. False (after reporting) when
 * the bits or the flags differ. */
static bool same_as_scalar(const loom__amp_kernels *k, const char *name, loom_dtype dt,
                           unsigned char *src, unsigned char *a, unsigned char *b, size_t n,
                           size_t off, float inv, bool *flag) {
  size_t es = loom_dtype_size(dt);
  fill(src, dt, n + off);
  memcpy(a, src, (n + off) * es);
  memcpy(b, src, (n + off) * es);
  bool fa = k_unscale(&loom__amp_kernels_scalar, dt, a + off * es, n, inv);
  bool fb = k_unscale(k, dt, b + off * es, n, inv);
  *flag = fa;
  if (fa == fb && memcmp(a, b, (n + off) * es) == 0) return true;
  lt_fail_at(__FILE__, __LINE__, "%s %s unscale n=%zu off=%zu inv=%g differs from scalar "
             "(flags %d %d)", name, loom_dtype_name(dt), n, off, (double)inv, fa, fb);
  return false;
}

LT_TEST(unscale_every_level_matches_scalar_bit_for_bit) {
  const loom__amp_kernels *k[LOOM_CPU_LEVEL_COUNT];
  const char *names[LOOM_CPU_LEVEL_COUNT];
  int nl = levels(k, names);
  if (nl < 2) lt_skip("only the scalar level on this CPU");
  float invs[4] = {1.0f / 65536, 1.0f / 3, 2.0f, 1.0f / 1000};
  size_t cap = 5000 + 4;
  unsigned char *src = malloc(cap * 4), *a = malloc(cap * 4), *b = malloc(cap * 4);
  for (int l = 1; l < nl; l++)
    for (int d = 0; d < 3; d++) {
      size_t es = loom_dtype_size(dts[d]);
      for (size_t n = 0; n < 5000; n = n < 160 ? n + 1 : n * 2 + 17)
        for (size_t off = 0; off < 3; off++) {
          bool fa;
          if (!same_as_scalar(k[l], names[l], dts[d], src, a, b, n, off, invs[(n + off) % 4], &fa))
            goto done;
          bool ca = k_check(&loom__amp_kernels_scalar, dts[d], a + off * es, n);
          bool cb = k_check(k[l], dts[d], a + off * es, n);
          LT_EQ(ca, cb);
          LT_EQ(ca, fa); /* the check agrees with what the fused pass found */
        }
    }
done:
  free(src);
  free(a);
  free(b);
}

LT_TEST(unscale_finds_inf_and_nan_at_every_position) {
  const loom__amp_kernels *k[LOOM_CPU_LEVEL_COUNT];
  const char *names[LOOM_CPU_LEVEL_COUNT];
  int nl = levels(k, names);
  static const size_t sizes[] = {1, 2, 7, 15, 16, 17, 31, 32, 33, 63, 64, 65, 127, 129, 1023,
                                 1024, 1025, 2111};
  float bad_values[3] = {INFINITY, -INFINITY, NAN};
  unsigned char *buf = malloc(2111 * 4), *work = malloc(2111 * 4);
  for (int l = 0; l < nl; l++)
    for (int d = 0; d < 3; d++) {
      size_t es = loom_dtype_size(dts[d]);
      for (size_t s = 0; s < sizeof sizes / sizeof sizes[0]; s++) {
        size_t n = sizes[s];
        fill(buf, dts[d], n);
        memcpy(work, buf, n * es);
        if (k_check(k[l], dts[d], work, n) || k_unscale(k[l], dts[d], work, n, 0.5f)) {
          lt_fail_at(__FILE__, __LINE__, "%s %s n=%zu: clean buffer reported non-finite",
                     names[l], loom_dtype_name(dts[d]), n);
          continue;
        }
        for (size_t p = 0; p < n; p++) {
          float v = bad_values[p % 3];
          memcpy(work, buf, n * es);
          put(work, dts[d], p, v);
          bool c = k_check(k[l], dts[d], work, n);
          bool u = k_unscale(k[l], dts[d], work, n, 1.0f / 1024);
          if (!c || !u) {
            lt_fail_at(__FILE__, __LINE__, "%s %s n=%zu: %g at %zu missed (check %d, unscale "
                       "%d)", names[l], loom_dtype_name(dts[d]), n, (double)v, p, c, u);
            goto done;
          }
        }
      }
    }
done:
  free(buf);
  free(work);
}

/* Buffers past LOOM__STREAM_BYTES, which the SIMD levels walk as interleaved streams: every
 * level against scalar, bit for bit, just below and past the threshold at misaligned starts;
 * and a single inf or NaN found wherever it sits: each stream's first and last elements (the
 * streams split the whole steps, 32 elements at AVX2 and 64 at AVX-512, in
 * LOOM__SWEEP_STREAMS equal parts) and the tail. */
LT_TEST(unscale_every_level_matches_scalar_on_streamed_buffers) {
  const loom__amp_kernels *k[LOOM_CPU_LEVEL_COUNT];
  const char *names[LOOM_CPU_LEVEL_COUNT];
  int nl = levels(k, names);
  if (nl < 2) lt_skip("only the scalar level on this CPU");
  size_t cap = LOOM__STREAM_BYTES / 2 + 600;
  unsigned char *src = malloc(cap * 4), *a = malloc(cap * 4), *b = malloc(cap * 4);
  LT_TRUE(src && a && b);
  for (int l = 1; l < nl && src && a && b; l++)
    for (int d = 0; d < 3; d++) {
      size_t es = loom_dtype_size(dts[d]), lim = LOOM__STREAM_BYTES / es;
      size_t lens[3] = {lim - 1, lim + 77, lim + 4 * 32 * 3 + 45};
      for (int t = 0; t < 3; t++)
        for (size_t off = 0; off < 3; off++) {
          size_t n = lens[t];
          bool fa;
          if (!same_as_scalar(k[l], names[l], dts[d], src, a, b, n, off,
                              t == 2 ? 2.0f : 1.0f / 3, &fa))
            goto done;
          if (t == 2 || off) continue;
          /* one non-finite value at the streams' ends (len: elements per stream), for the
           * AVX2 level's 32-element steps and the AVX-512 level's 64 */
          fill(src, dts[d], n);
          for (size_t step = 32; step <= 64; step *= 2) {
            size_t len = n / (4 * step) * step; /* 4: LOOM__SWEEP_STREAMS */
            size_t at[] = {0,           len - 1, len,         2 * len - 1, 2 * len,
                           3 * len - 1, 3 * len, 4 * len - 1, 4 * len,     n - 1};
            for (size_t p = 0; p < sizeof at / sizeof at[0]; p++) {
              memcpy(b, src, n * es);
              put(b, dts[d], at[p], p % 2 ? NAN : -INFINITY);
              if (!k_unscale(k[l], dts[d], b, n, 1.0f / 1024)) {
                lt_fail_at(__FILE__, __LINE__, "%s %s n=%zu: non-finite at %zu missed",
                           names[l], loom_dtype_name(dts[d]), n, at[p]);
                goto done;
              }
            }
          }
          memcpy(b, src, n * es);
          LT_TRUE(!k_unscale(k[l], dts[d], b, n, 1.0f / 1024));
        }
    }
done:
  free(src);
  free(a);
  free(b);
}

LT_TEST(unscale_is_exact_for_power_of_two_scales) {
  float x[1000], want[1000];
  for (int i = 0; i < 1000; i++) {
    x[i] = finite_value();
    want[i] = x[i] / 65536.0f;
  }
  bool found = true;
  LT_OK(loom__amp_unscale(x, LOOM_F32, 1000, 1.0 / 65536, &found));
  LT_TRUE(!found);
  LT_EQ(memcmp(x, want, sizeof x), 0);
}

LT_TEST(unscale_buffer_api_and_errors) {
  float x[3] = {3, 6, 9};
  bool f = true;
  LT_OK(loom__amp_unscale(x, LOOM_F32, 3, 1.0 / 3.0, &f));
  LT_TRUE(!f);
  LT_NEAR(x[1], 2, 1e-6);
  LT_OK(loom__amp_unscale(NULL, LOOM_F32, 0, 0.5, &f)); /* nothing to do */
  LT_TRUE(!f);
  LT_OK(loom__amp_unscale(x, LOOM_F32, 3, 0.5, NULL)); /* the flag is optional */
  LT_ERR(loom__amp_unscale(x, LOOM_I32, 3, 0.5, &f), LOOM_EDTYPE, "dtype i32 is not f32");
  LT_ERR(loom__amp_unscale(NULL, LOOM_F32, 3, 0.5, &f), LOOM_EINVAL, "data is NULL");
  LT_ERR(loom__amp_unscale(x, LOOM_F32, 3, 0, &f), LOOM_EINVAL, "inv_scale 0 is not");
  LT_ERR(loom__amp_unscale(x, LOOM_F32, 3, -1, &f), LOOM_EINVAL, "inv_scale -1");
  LT_ERR(loom__amp_unscale(x, LOOM_F32, 3, NAN, &f), LOOM_EINVAL, "inv_scale nan");
  LT_ERR(loom__amp_unscale(x, LOOM_F32, 3, 1e300, &f), LOOM_EINVAL, "not a finite f32");
  LT_ERR(loom__amp_unscale(x, LOOM_F32, 3, 1e-300, &f), LOOM_EINVAL, "not a finite f32");
  bool has = false;
  LT_OK(loom__amp_has_nonfinite(x, LOOM_F32, 3, &has));
  LT_TRUE(!has);
  uint16_t h[2] = {0x3c00, 0x7e00};
  LT_OK(loom__amp_has_nonfinite(h, LOOM_F16, 2, &has));
  LT_TRUE(has);
  LT_OK(loom__amp_has_nonfinite(h, LOOM_BF16, 2, &has)); /* 0x7e00 is a finite bf16 */
  LT_TRUE(!has);
  LT_ERR(loom__amp_has_nonfinite(h, LOOM_I64, 2, &has), LOOM_EDTYPE, "i64");
  LT_ERR(loom__amp_has_nonfinite(h, LOOM_F16, 2, NULL), LOOM_EINVAL, "out is NULL");
}

LT_TEST(unscale_tensor_lists_contiguous_strided_and_null) {
  /* a [4, 6] f32 tensor, unscaled through its transpose (a strided view) */
  loom_tensor *a = NULL, *at = NULL, *h = NULL, *lab = NULL;
  LT_OK(loom_tensor_empty(LOOM_F32, 2, (int64_t[]){4, 6}, &a));
  float *pa = loom_tensor_data(a);
  for (int i = 0; i < 24; i++) pa[i] = (float)(i * 8);
  LT_OK(loom_tensor_transpose(a, 0, 1, &at));
  LT_OK(loom_tensor_empty(LOOM_BF16, 1, (int64_t[]){100}, &h));
  uint16_t *ph = loom_tensor_data(h);
  for (int i = 0; i < 100; i++) ph[i] = loom_f32_to_bf16((float)i);
  loom_tensor *list[3] = {at, NULL, h};
  bool f = true;
  LT_OK(loom__amp_unscale_tensors(list, 3, 0.125, &f));
  LT_TRUE(!f);
  for (int i = 0; i < 24; i++) LT_EQ(pa[i], i);
  LT_EQ(loom_bf16_to_f32(ph[99]) * 8, 99);
  bool has = true;
  LT_OK(loom__amp_has_nonfinite_tensors(list, 3, &has));
  LT_TRUE(!has);
  pa[13] = NAN; /* reached through the strided view */
  LT_OK(loom__amp_has_nonfinite_tensors(list, 3, &has));
  LT_TRUE(has);
  LT_OK(loom__amp_unscale_tensors(list, 3, 0.5, &f));
  LT_TRUE(f);
  LT_EQ(pa[12] * 2, 12);
  LT_OK(loom_tensor_zeros(LOOM_I32, 1, (int64_t[]){2}, &lab));
  loom_tensor *badl[2] = {a, lab};
  LT_ERR(loom__amp_unscale_tensors(badl, 2, 0.5, &f), LOOM_EDTYPE, "tensor 1 has dtype i32");
  LT_EQ(pa[12] * 2, 12); /* nothing changed: every tensor is checked first */
  LT_ERR(loom__amp_unscale_tensors(NULL, 2, 0.5, &f), LOOM_EINVAL, "tensor list is NULL");
  LT_ERR(loom__amp_unscale_tensors(list, 3, INFINITY, &f), LOOM_EINVAL, "inv_scale inf");
  LT_ERR(loom__amp_has_nonfinite_tensors(badl, 2, &has), LOOM_EDTYPE, "i32");
  LT_OK(loom__amp_unscale_tensors(NULL, 0, 0.5, &f));
  LT_TRUE(!f);
  loom_tensor_free(lab);
  loom_tensor_free(h);
  loom_tensor_free(at);
  loom_tensor_free(a);
}
