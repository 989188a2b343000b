/* test_cvt.c: f32 <-> f16 / bf16 conversions. The scalar reference against values worked out
 * by hand (largest finite, smallest subnormal, exact halfway cases, zeros, infinities, NaN);
 * every dispatch level against the scalar reference on all 2^16 widening inputs and on random
 * and special narrowing inputs at every alignment and ragged length, and on arrays large
 * enough for the streaming path; loom_convert and loom__round_via on 1 and 2 threads. (All 2^32
 * narrowing inputs: test_cvt_exhaustive_slow.c.) */
#include "lt.h"
#include "core/kernels/kernels.h"
#include "ops/gemm.h"

#include <loom/loom.h>
#include <stdlib.h>
#include <string.h>

static uint16_t f16(uint32_t bits) { return loom__ref_f32_to_f16(bits); }
static uint16_t bf16(uint32_t bits) { return loom__ref_f32_to_bf16(bits); }

LT_TEST(cvt_f32_to_f16_reference_edges) {
  LT_EQ_HEX(f16(0x3f800000), 0x3c00);        /* 1.0 */
  LT_EQ_HEX(f16(0xc0000000), 0xc000);        /* -2.0 */
  LT_EQ_HEX(f16(0x00000000), 0x0000);        /* +0 */
  LT_EQ_HEX(f16(0x80000000), 0x8000);        /* -0 */
  LT_EQ_HEX(f16(0x3dcccccd), 0x2e66);        /* 0.1f */
  LT_EQ_HEX(f16(0x477fe000), 0x7bff);        /* 65504: largest finite */
  LT_EQ_HEX(f16(0x477fefff), 0x7bff);        /* just below the halfway point to 65536 */
  LT_EQ_HEX(f16(0x477ff000), 0x7c00);        /* 65520: halfway, ties to even -> inf */
  LT_EQ_HEX(f16(0x501502f9), 0x7c00);        /* 1e10: overflow -> inf */
  LT_EQ_HEX(f16(0xd01502f9), 0xfc00);        /* -1e10 -> -inf */
  LT_EQ_HEX(f16(0x7f800000), 0x7c00);        /* inf */
  LT_EQ_HEX(f16(0xff800000), 0xfc00);        /* -inf */
  LT_EQ_HEX(f16(0x38800000), 0x0400);        /* 2^-14: smallest normal */
  LT_EQ_HEX(f16(0x33800000), 0x0001);        /* 2^-24: smallest subnormal */
  LT_EQ_HEX(f16(0x33000000), 0x0000);        /* 2^-25: halfway to 0, ties to even -> 0 */
  LT_EQ_HEX(f16(0x33000001), 0x0001);        /* just above 2^-25 -> smallest subnormal */
  LT_EQ_HEX(f16(0x33c00000), 0x0002);        /* 3 * 2^-25: halfway 1|2 -> even 2 */
  LT_EQ_HEX(f16(0x34200000), 0x0002);        /* 5 * 2^-25: halfway 2|3 -> even 2 */
  LT_EQ_HEX(f16(0x387fc000), 0x03ff);        /* largest subnormal */
  LT_EQ_HEX(f16(0x387fe000), 0x0400);        /* largest subnormal + half ulp: ties to even, normal */
  LT_EQ_HEX(f16(0x3f801000), 0x3c00);        /* 1 + 2^-11: halfway, ties to even (down) */
  LT_EQ_HEX(f16(0x3f803000), 0x3c02);        /* 1 + 3*2^-11: halfway, ties to even (up) */
  LT_EQ_HEX(f16(0x3f801001), 0x3c01);        /* just above halfway */
  LT_EQ_HEX(f16(0x00000001), 0x0000);        /* f32 subnormal -> 0 */
  LT_EQ_HEX(f16(0x80000001), 0x8000);        /* negative f32 subnormal -> -0 */
  LT_EQ_HEX(f16(0x7fc00000), 0x7e00);        /* quiet NaN */
  LT_EQ_HEX(f16(0xffc00000), 0xfe00);        /* negative NaN keeps its sign */
  LT_EQ_HEX(f16(0x7f800001), 0x7e00);        /* signalling NaN -> quiet NaN, not inf */
  LT_EQ_HEX(f16(0xff802000) & 0xfc00, 0xfc00); /* NaN payload kept where it fits */
  LT_TRUE((f16(0xff802000) & 0x03ff) != 0);
}

LT_TEST(cvt_f32_to_bf16_reference_edges) {
  LT_EQ_HEX(bf16(0x3f800000), 0x3f80); /* 1.0 */
  LT_EQ_HEX(bf16(0x3f808000), 0x3f80); /* 1 + 2^-8: halfway, ties to even (down) */
  LT_EQ_HEX(bf16(0x3f818000), 0x3f82); /* halfway, ties to even (up) */
  LT_EQ_HEX(bf16(0x3f808001), 0x3f81); /* just above halfway */
  LT_EQ_HEX(bf16(0x7f7f0000), 0x7f7f); /* largest finite bf16 */
  LT_EQ_HEX(bf16(0x7f7fffff), 0x7f80); /* largest f32 rounds up to inf */
  LT_EQ_HEX(bf16(0x7f7f7fff), 0x7f7f); /* just below halfway stays finite */
  LT_EQ_HEX(bf16(0x00010000), 0x0001); /* smallest bf16 subnormal */
  LT_EQ_HEX(bf16(0x00008000), 0x0000); /* halfway to 0: ties to even -> 0 */
  LT_EQ_HEX(bf16(0x00018000), 0x0002); /* halfway 1|2 -> 2 */
  LT_EQ_HEX(bf16(0x00008001), 0x0001); /* subnormal input is kept, not flushed */
  LT_EQ_HEX(bf16(0x80000001), 0x8000); /* tiny negative -> -0 */
  LT_EQ_HEX(bf16(0x80000000), 0x8000);
  LT_EQ_HEX(bf16(0x7f800000), 0x7f80);
  LT_EQ_HEX(bf16(0xff800000), 0xff80);
  LT_EQ_HEX(bf16(0x7fc00000), 0x7fc0);
  LT_EQ_HEX(bf16(0xff800001), 0xffc0); /* signalling negative NaN -> quiet negative NaN */
  LT_EQ_HEX(bf16(0x7f800001), 0x7fc0); /* not inf: rounding must not carry a NaN to inf */
  LT_EQ_HEX(bf16(0x7fffffff), 0x7fff); /* NaN with a full payload stays NaN */
}

LT_TEST(cvt_widening_reference_edges) {
  LT_EQ_HEX(loom__ref_f16_to_f32(0x0001), 0x33800000); /* 2^-24 */
  LT_EQ_HEX(loom__ref_f16_to_f32(0x03ff), 0x387fc000); /* largest subnormal */
  LT_EQ_HEX(loom__ref_f16_to_f32(0x0400), 0x38800000);
  LT_EQ_HEX(loom__ref_f16_to_f32(0x7bff), 0x477fe000); /* 65504 */
  LT_EQ_HEX(loom__ref_f16_to_f32(0x7c00), 0x7f800000);
  LT_EQ_HEX(loom__ref_f16_to_f32(0xfc00), 0xff800000);
  LT_EQ_HEX(loom__ref_f16_to_f32(0x8000), 0x80000000);
  LT_EQ_HEX(loom__ref_f16_to_f32(0xfe00), 0xffc00000);
  LT_EQ_HEX(loom__ref_f16_to_f32(0x7c01), 0x7fc02000); /* sNaN -> quiet, payload kept */
  LT_EQ_HEX(loom__ref_bf16_to_f32(0x0001), 0x00010000);
  LT_EQ_HEX(loom__ref_bf16_to_f32(0xff80), 0xff800000);
  /* widening then narrowing is the identity for every non-NaN value */
  for (uint32_t h = 0; h < 65536; h++) {
    uint32_t w = loom__ref_f16_to_f32((uint16_t)h);
    if ((h & 0x7c00) == 0x7c00 && (h & 0x3ff)) continue;
    if (loom__ref_f32_to_f16(w) != h) LT_EQ_HEX(loom__ref_f32_to_f16(w), h);
    if (loom__ref_f32_to_bf16(loom__ref_bf16_to_f32((uint16_t)h)) != h &&
        !(((h & 0x7f80) == 0x7f80) && (h & 0x7f)))
      LT_EQ_HEX(h, 0);
  }
}

/* The kernels of every level this CPU has, by name, for comparison with scalar. */
typedef struct level_kernels {
  const char *name;
  loom__core_kernels k;
} level_kernels;

static int levels(level_kernels *out) {
  int n = 0;
  if (loom_cpu_supports(LOOM_CPU_AVX2)) out[n++] = (level_kernels){"avx2", loom__core_kernels_avx2};
  if (loom_cpu_supports(LOOM_CPU_AVX512)) {
    out[n++] = (level_kernels){"avx512", loom__core_kernels_avx512};
    if (loom_cpu_has_avx512bf16()) {
      out[n] = (level_kernels){"avx512bf16", loom__core_kernels_avx512};
      out[n++].k.cvt_f32_to_bf16 = loom__cvt_f32_to_bf16_avx512bf16;
    }
  }
  return n;
}

static uint32_t rng_state = 12345;
static uint32_t rnd(void) {
  rng_state ^= rng_state << 13;
  rng_state ^= rng_state >> 17;
  rng_state ^= rng_state << 5;
  return rng_state;
}

LT_TEST(cvt_every_level_matches_scalar_all_widening_inputs) {
  level_kernels lv[4];
  int nl = levels(lv);
  if (!nl) lt_skip("this CPU has no vector level");
  uint16_t *src = malloc(65536 * 2 + 64);
  float *ref = malloc(65536 * 4), *got = malloc(65536 * 4 + 64);
  for (uint32_t i = 0; i < 65536; i++) src[i] = (uint16_t)i;
  for (int l = 0; l < nl; l++) {
    for (int which = 0; which < 2; which++) {
      void (*fast)(const uint16_t *, float *, size_t) =
          which ? lv[l].k.cvt_bf16_to_f32 : lv[l].k.cvt_f16_to_f32;
      void (*slow)(const uint16_t *, float *, size_t) =
          which ? loom__core_kernels_scalar.cvt_bf16_to_f32 : loom__core_kernels_scalar.cvt_f16_to_f32;
      slow(src, ref, 65536);
      fast(src, got, 65536);
      int bad = 0;
      for (uint32_t i = 0; i < 65536 && bad < 5; i++)
        if (memcmp(&ref[i], &got[i], 4)) {
          bad++;
          lt_fail_at(__FILE__, __LINE__, "%s %s(0x%04x): got 0x%08x want 0x%08x", lv[l].name,
                     which ? "bf16_to_f32" : "f16_to_f32", i, ((uint32_t *)got)[i],
                     ((uint32_t *)ref)[i]);
        }
    }
  }
  free(src);
  free(ref);
  free(got);
}

LT_TEST(cvt_every_level_matches_scalar_on_ragged_unaligned_arrays) {
  level_kernels lv[4];
  int nl = levels(lv);
  if (!nl) lt_skip("this CPU has no vector level");
  enum { N = 1 << 16 };
  uint32_t *src = malloc((N + 64) * 4);
  uint16_t *ref = malloc((N + 64) * 2), *got = malloc((N + 64) * 2);
  static const uint32_t specials[] = {0, 0x80000000, 0x7f800000, 0xff800000, 0x7fc00000,
                                      0xff800001, 0x00000001, 0x807fffff, 0x477ff000,
                                      0x33000000, 0x7f7fffff, 0x00008000, 0x3f808000};
  for (uint32_t i = 0; i < N + 64; i++)
    src[i] = (i % 7 == 0) ? specials[i / 7 % 13] : (i % 3 ? rnd() : (rnd() & 0x807fffff));
  size_t lens[] = {0, 1, 15, 16, 17, 31, 33, 100, 1000, N};
  for (int l = 0; l < nl; l++)
    for (int which = 0; which < 2; which++)
      for (size_t s = 0; s < 4; s++)
        for (size_t d = 0; d < 3; d++)
          for (size_t li = 0; li < sizeof lens / sizeof lens[0]; li++) {
            size_t n = lens[li];
            const float *in = (const float *)(src + s);
            void (*fast)(const float *, uint16_t *, size_t) =
                which ? lv[l].k.cvt_f32_to_bf16 : lv[l].k.cvt_f32_to_f16;
            void (*slow)(const float *, uint16_t *, size_t) =
                which ? loom__core_kernels_scalar.cvt_f32_to_bf16
                      : loom__core_kernels_scalar.cvt_f32_to_f16;
            memset(got, 0xab, (N + 64) * 2);
            slow(in, ref + d, n);
            fast(in, got + d, n);
            if (memcmp(ref + d, got + d, n * 2))
              lt_fail_at(__FILE__, __LINE__, "%s %s: n=%zu src+%zu dst+%zu differs", lv[l].name,
                         which ? "f32_to_bf16" : "f32_to_f16", n, s, d);
            if (got[d + n] != 0xabab)
              lt_fail_at(__FILE__, __LINE__, "%s wrote past the end (n=%zu)", lv[l].name, n);
          }
  free(src);
  free(ref);
  free(got);
}

/* Arrays past LOOM__STREAM_BYTES take the streaming path (non-temporal stores, several
 * interleaved read streams): all four conversions of every level against scalar, at lengths
 * just below, at and past the threshold (ragged ends), src and dst at several offsets, with
 * nothing written outside dst. */
LT_TEST(cvt_every_level_matches_scalar_on_streamed_arrays) {
  level_kernels lv[4];
  int nl = levels(lv);
  if (!nl) lt_skip("this CPU has no vector level");
  enum { PAD = 64 };
  const size_t big = LOOM__STREAM_BYTES / 2 + 4 * 32 * 3 + 37; /* narrowing streams from 2M */
  uint32_t *src = malloc((big + PAD) * 4);
  uint32_t *ref = malloc((big + PAD) * 4), *got = malloc((big + PAD) * 4);
  LT_TRUE(src && ref && got);
  if (!src || !ref || !got) goto done;
  for (size_t i = 0; i < big + PAD; i++)
    src[i] = (i % 5 == 0) ? (rnd() & 0x807fffff) : (i % 11 == 0) ? (0x7f800000 | rnd()) : rnd();
  static const size_t offs[][2] = {{0, 0}, {1, 0}, {0, 1}, {3, 7}, {2, 31}}; /* src, dst elements */
  const size_t lens[] = {LOOM__STREAM_BYTES / 4 - 1, LOOM__STREAM_BYTES / 4 + 5,
                         LOOM__STREAM_BYTES / 2 - 1, LOOM__STREAM_BYTES / 2, big};
  for (int l = 0; l < nl; l++)
    for (int c = 0; c < 4; c++)
      for (size_t o = 0; o < sizeof offs / sizeof offs[0]; o++)
        for (size_t li = 0; li < sizeof lens / sizeof lens[0]; li++) {
          size_t n = lens[li], so = offs[o][0], d = offs[o][1], eo = c < 2 ? 2 : 4; /* out size */
          memset(ref, 0xab, (big + PAD) * 4);
          memset(got, 0xab, (big + PAD) * 4);
          const loom__core_kernels *k[2] = {&loom__core_kernels_scalar, &lv[l].k};
          for (int w = 0; w < 2; w++) {
            void *out = (char *)(w ? got : ref) + d * eo;
            if (c == 0) k[w]->cvt_f32_to_bf16((const float *)(src + so), out, n);
            if (c == 1) k[w]->cvt_f32_to_f16((const float *)(src + so), out, n);
            if (c == 2) k[w]->cvt_bf16_to_f32((const uint16_t *)src + so, out, n);
            if (c == 3) k[w]->cvt_f16_to_f32((const uint16_t *)src + so, out, n);
          }
          if (memcmp(ref, got, (big + PAD) * 4))
            lt_fail_at(__FILE__, __LINE__, "%s conversion %d: n=%zu src+%zu dst+%zu differs "
                       "(or wrote outside dst)", lv[l].name, c, n, so, d);
        }
done:
  free(src);
  free(ref);
  free(got);
}

LT_TEST(cvt_public_entry_points_follow_the_active_level) {
  float in[40];
  uint16_t out[40], want[40];
  for (int i = 0; i < 40; i++) in[i] = (float)i * 0.37f - 5.0f;
  loom_cpu_level keep = loom_cpu_level_active();
  for (int l = 0; l < LOOM_CPU_LEVEL_COUNT; l++) {
    if (!loom_cpu_supports((loom_cpu_level)l)) continue;
    LT_OK(loom_set_cpu_level((loom_cpu_level)l));
    loom_cvt_f32_to_bf16(in, out, 40);
    for (int i = 0; i < 40; i++) want[i] = loom_f32_to_bf16(in[i]);
    LT_TRUE(memcmp(out, want, sizeof out) == 0);
    loom_cvt_f32_to_f16(in, out, 40);
    float back[40];
    loom_cvt_f16_to_f32(out, back, 40);
    for (int i = 0; i < 40; i++) LT_NEAR(back[i], in[i], fabs(in[i]) * 1e-3);
    loom_cvt_bf16_to_f32(want, back, 40);
    for (int i = 0; i < 40; i++) LT_EQ(back[i], loom_bf16_to_f32(want[i]));
  }
  LT_OK(loom_set_cpu_level(keep));
  loom_tensor *t = NULL;
  LT_OK(loom_convert(in, LOOM_F32, out, LOOM_F16, 40));
  LT_ERR(loom_convert(in, (loom_dtype)17, out, LOOM_F16, 4), LOOM_EDTYPE, "invalid dtype");
  (void)t;
}

/* loom_convert's long float conversions run in chunks over the caller's OpenMP team, and
 * loom__round_via rounds through a 16-bit dtype in one pass (in place or not): on 1 and 2
 * threads, past the parallel threshold and at unaligned offsets, every element must be the
 * scalar kernels' (the chunks must neither overlap, drop a tail, nor write outside dst). */
LT_TEST(cvt_convert_and_round_via_on_threads_match_scalar) {
  enum { PAD = 64 };
  const size_t n = (1u << 17) + (1u << 15) + 77; /* past CVT_PAR_MIN, a ragged last chunk */
  uint32_t *src = malloc((n + PAD) * 4), *ref = malloc((n + PAD) * 4), *got = malloc((n + PAD) * 4);
  LT_TRUE(src && ref && got);
  if (!src || !ref || !got) goto done;
  for (size_t i = 0; i < n + PAD; i++)
    src[i] = (i % 5 == 0) ? (rnd() & 0x807fffff) : (i % 11 == 0) ? (0x7f800000 | rnd()) : rnd();
  const loom__core_kernels *s = &loom__core_kernels_scalar;
  loom_dtype lo[2] = {LOOM_BF16, LOOM_F16};
  int before = loom__gemm_threads();
  for (int threads = 1; threads <= 2; threads++) {
    LT_OK(loom_set_num_threads(threads));
    for (int c = 0; c < 4; c++)
      for (size_t off = 0; off < 4; off += 3) {
        loom_dtype dt = lo[c % 2];
        bool narrow = c < 2;
        size_t eo = narrow ? 2 : 4;
        memset(ref, 0xab, (n + PAD) * 4);
        memset(got, 0xab, (n + PAD) * 4);
        void *r = (char *)ref + off * eo, *g = (char *)got + off * eo;
        if (c == 0) s->cvt_f32_to_bf16((const float *)src, r, n);
        if (c == 1) s->cvt_f32_to_f16((const float *)src, r, n);
        if (c == 2) s->cvt_bf16_to_f32((const uint16_t *)src, r, n);
        if (c == 3) s->cvt_f16_to_f32((const uint16_t *)src, r, n);
        LT_OK(loom_convert(src, narrow ? LOOM_F32 : dt, g, narrow ? dt : LOOM_F32, n));
        if (memcmp(ref, got, (n + PAD) * 4))
          lt_fail_at(__FILE__, __LINE__, "loom_convert %d, %d threads, dst+%zu differs", c,
                     threads, off);
      }
    for (int d = 0; d < 2; d++)
      for (int in_place = 0; in_place < 2; in_place++) {
        uint16_t *h = (uint16_t *)ref + 2 * (n + PAD) - n; /* (the second half of ref) */
        if (d == 0) s->cvt_f32_to_bf16((const float *)src, h, n);
        else s->cvt_f32_to_f16((const float *)src, h, n);
        float *want = malloc(n * 4);
        LT_TRUE(want != NULL);
        if (!want) goto done;
        if (d == 0) s->cvt_bf16_to_f32(h, want, n);
        else s->cvt_f16_to_f32(h, want, n);
        memset(got, 0xab, (n + PAD) * 4);
        if (in_place) memcpy(got, src, n * 4);
        loom__round_via(lo[d], in_place ? (const float *)got : (const float *)src, (float *)got, n);
        if (memcmp(want, got, n * 4) || got[n] != 0xabababab)
          lt_fail_at(__FILE__, __LINE__, "loom__round_via %s, %d threads, in place %d differs",
                     loom_dtype_name(lo[d]), threads, in_place);
        free(want);
      }
  }
  loom__gemm_set_threads(before);
done:
  free(src);
  free(ref);
  free(got);
}
