/* test_reduce_levels.c: the dist combine kernels of every CPU level this machine runs against
 * the scalar reference, bit for bit, for every dtype and op, over full blocks and ragged
 * lengths, with NaN, infinities, signed zeros and integer overflow in the data (the f32
 * division of LOOM_AVG too) and the fused two-source sum / average; and loom__reduce's f32
 * sum and average against the elementwise a + b and (a + b + c) / 3 on the active level. */
#include "dist_test.h"
#include "dist/reduce_int.h"

#include <math.h>
#include <string.h>

#define N LOOM__REDUCE_BLK

static uint64_t rng_state = 0x9e3779b97f4a7c15ull;
static uint64_t rnd(void) {
  rng_state ^= rng_state << 13;
  rng_state ^= rng_state >> 7;
  rng_state ^= rng_state << 17;
  return rng_state;
}

/* kind 0 f32, 1 i32, 2 i64: random values with specials sprinkled in. */
static void fill(int kind, void *p, size_t n) {
  for (size_t i = 0; i < n; i++) {
    uint64_t r = rnd();
    if (kind == 0) {
      static const float sp[] = {0.0f, -0.0f, INFINITY, -INFINITY, NAN, 1e-45f, 3.4e38f};
      float v = (float)((double)(r >> 11) / 9007199254740992.0 * 200.0 - 100.0);
      ((float *)p)[i] = (r & 15) == 0 ? sp[(r >> 4) % 7] : v;
    } else if (kind == 1) {
      ((int32_t *)p)[i] = (r & 7) == 0 ? INT32_MAX : (int32_t)(uint32_t)r;
    } else {
      ((int64_t *)p)[i] = (r & 7) == 0 ? INT64_MIN : (int64_t)r;
    }
  }
}

LT_TEST(dist_reduce_levels_match_scalar) {
  static const size_t lens[] = {N, 0, 1, 7, 15, 16, 17, 31, 33, 63, 64, 65, 100, 1023};
  static const size_t es[3] = {4, 4, 8};
  const loom__reduce_kernels *ref = loom__reduce_kernels_for(LOOM_CPU_SCALAR);
  _Alignas(64) unsigned char a0[N * 8 + 64], b[N * 8 + 64], x[N * 8 + 64], y[N * 8 + 64];
  int levels = 0;
  for (int l = LOOM_CPU_AVX2; l < LOOM_CPU_LEVEL_COUNT; l++) {
    if (!loom_cpu_supports((loom_cpu_level)l)) continue;
    levels++;
    const loom__reduce_kernels *k = loom__reduce_kernels_for((loom_cpu_level)l);
    LT_TRUE(k != ref);
    for (int kind = 0; kind < 3; kind++)
      for (int op = 0; op < LOOM_REDOP_COUNT; op++)
        for (size_t t = 0; t < sizeof lens / sizeof lens[0]; t++)
          for (size_t mis = 0; mis < 2; mis++) { /* aligned, and off by one element */
            size_t n = lens[t], o = mis * es[kind];
            if (n + mis > N) n = N - mis;
            fill(kind, a0, N + 1);
            fill(kind, b, N + 1);
            memcpy(x, a0, sizeof a0);
            memcpy(y, a0, sizeof a0);
            ref->combine[kind][op](x + o, b + o, n);
            k->combine[kind][op](y + o, b + o, n);
            if (memcmp(x, y, sizeof x) != 0) {
              lt_fail_at(__FILE__, __LINE__, "level %s kind %d op %d n %zu misaligned %zu differs",
                      loom_cpu_level_name((loom_cpu_level)l), kind, op, n, mis);
              return;
            }
          }
  }
  if (!levels) lt_skip("no SIMD level on this CPU");
}

/* The two-source f32 sum and average, written to two destinations (one of them in place), as
 * the threads backend's large all-reduce calls it: every destination gets a + b, or (a + b) / 2,
 * element for element, on the active level (the fused kernel where it has one) and on scalar. */
LT_TEST(dist_reduce_to_all_two_sources_two_destinations) {
  enum { M = 3 * N + 45 };
  float *a = malloc(M * sizeof(float)), *b = malloc(M * sizeof(float)),
        *x = malloc(M * sizeof(float)), *y = malloc(M * sizeof(float));
  LT_TRUE(a && b && x && y);
  for (int pass = 0; pass < 2; pass++) {
    loom_cpu_level was = loom_cpu_level_active();
    if (pass == 1) LT_OK(loom_set_cpu_level(LOOM_CPU_SCALAR));
    for (int avg = 0; avg < 2; avg++) {
      fill(0, a, M);
      fill(0, b, M);
      memcpy(x, a, M * sizeof(float)); /* x is the first source, in place */
      const void *srcs[2] = {x, b};
      void *dsts[2] = {x, y};
      loom__reduce_to_all(dsts, 2, srcs, 2, M, LOOM_F32, avg ? LOOM_AVG : LOOM_SUM);
      size_t bad = 0;
      for (size_t i = 0; i < M; i++) {
        float e = avg ? (a[i] + b[i]) / 2.0f : a[i] + b[i];
        for (int d = 0; d < 2; d++) {
          float got = d ? y[i] : x[i];
          if (memcmp(&e, &got, 4) != 0 && !(isnan(e) && isnan(got))) bad++;
        }
      }
      LT_EQ(bad, 0);
    }
    LT_OK(loom_set_cpu_level(was));
  }
  free(a);
  free(b);
  free(x);
  free(y);
}

/* The fused two-source f32 sum / average of every level that has one, called directly: each
 * destination (one, two or three; the first in place over a or b, or apart) gets the
 * scalar's a + b, or (a + b) * 0.5, bit for bit, at ragged lengths and offsets. */
LT_TEST(dist_reduce_levels_sum2_match_scalar) {
  static const size_t lens[] = {0, 1, 7, 8, 15, 16, 17, 31, 33, 100, N, N + 45};
  enum { M = N + 64 };
  float *a0 = malloc(M * 4), *b0 = malloc(M * 4), *a = malloc(M * 4), *b = malloc(M * 4),
        *y = malloc(M * 4), *z = malloc(M * 4);
  LT_TRUE(a0 && b0 && a && b && y && z);
  int levels = 0;
  for (int l = LOOM_CPU_AVX2; l < LOOM_CPU_LEVEL_COUNT && a0 && b0 && a && b && y && z; l++) {
    const loom__reduce_kernels *k = loom__reduce_kernels_for((loom_cpu_level)l);
    if (!loom_cpu_supports((loom_cpu_level)l) || !k->sum2_f32) continue;
    levels++;
    for (size_t t = 0; t < sizeof lens / sizeof lens[0]; t++)
      for (int avg = 0; avg < 2; avg++)
        for (int ndst = 1; ndst <= 3; ndst++)
          for (int first = 0; first < 3; first++) { /* dsts[0]: a, b or apart */
            size_t n = lens[t], o = t % 3;           /* misaligned starts */
            fill(0, a0, M);
            fill(0, b0, M);
            memcpy(a, a0, M * 4);
            memcpy(b, b0, M * 4);
            memset(y, 0, M * 4);
            memset(z, 0, M * 4);
            float *dsts[3] = {first == 0 ? a + o : first == 1 ? b + o : y + o, y + o, z + o};
            if (first == 2) dsts[1] = z + o, dsts[2] = a + o;
            k->sum2_f32(dsts, ndst, a + o, b + o, n, avg ? 0.5f : 1.0f);
            size_t bad = 0;
            for (int d = 0; d < ndst; d++)
              for (size_t i = 0; i < n; i++) {
                float e = avg ? (a0[o + i] + b0[o + i]) * 0.5f : a0[o + i] + b0[o + i];
                if (memcmp(&e, &dsts[d][i], 4) != 0 && !(isnan(e) && isnan(dsts[d][i]))) bad++;
              }
            if (bad) {
              lt_fail_at(__FILE__, __LINE__, "level %s sum2 n %zu avg %d ndst %d first %d: %zu bad",
                         loom_cpu_level_name((loom_cpu_level)l), n, avg, ndst, first, bad);
              goto done;
            }
          }
  }
done:
  free(a0), free(b0), free(a), free(b), free(y), free(z);
  if (!levels) lt_skip("no SIMD level with a fused two-source sum on this CPU");
}

LT_TEST(dist_reduce_levels_divide_as_scalar) {
  static const size_t lens[] = {N, 0, 1, 15, 16, 17, 100, 1023};
  static const float divs[] = {2.0f, 3.0f, 7.0f, 1.0f, 4.0f, 1024.0f, 0.5f};
  const loom__reduce_kernels *ref = loom__reduce_kernels_for(LOOM_CPU_SCALAR);
  _Alignas(64) float a0[N + 16], x[N + 16], y[N + 16];
  int levels = 0;
  for (int l = LOOM_CPU_AVX2; l < LOOM_CPU_LEVEL_COUNT; l++) {
    if (!loom_cpu_supports((loom_cpu_level)l)) continue;
    levels++;
    const loom__reduce_kernels *k = loom__reduce_kernels_for((loom_cpu_level)l);
    for (size_t t = 0; t < sizeof lens / sizeof lens[0]; t++)
      for (size_t d = 0; d < sizeof divs / sizeof divs[0]; d++) {
        fill(0, a0, N + 16);
        memcpy(x, a0, sizeof a0);
        memcpy(y, a0, sizeof a0);
        ref->div_f32(x + 1, lens[t], divs[d]);
        k->div_f32(y + 1, lens[t], divs[d]);
        /* the scalar reference is itself the IEEE quotient (volatile: a real division) */
        for (size_t i = 0; i < lens[t]; i++) {
          volatile float q = divs[d];
          float e = a0[1 + i] / q;
          LT_TRUE(memcmp(&e, &x[1 + i], 4) == 0 || (isnan(e) && isnan(x[1 + i])));
        }
        if (memcmp(x, y, sizeof x) != 0) {
          lt_fail_at(__FILE__, __LINE__, "level %s n %zu divisor %g differs",
                     loom_cpu_level_name((loom_cpu_level)l), lens[t], (double)divs[d]);
          return;
        }
      }
  }
  if (!levels) lt_skip("no SIMD level on this CPU");
}

LT_TEST(dist_reduce_f32_sum_is_elementwise_add) {
  enum { M = 3 * N + 37 };
  float *a = malloc(M * sizeof(float)), *b = malloc(M * sizeof(float)),
        *d = malloc(M * sizeof(float));
  LT_TRUE(a && b && d);
  fill(0, a, M);
  fill(0, b, M);
  const void *srcs[2] = {a, b};
  loom__reduce(d, srcs, 2, M, LOOM_F32, LOOM_SUM);
  size_t bad = 0;
  for (size_t i = 0; i < M; i++) {
    float e = a[i] + b[i];
    if (memcmp(&e, &d[i], 4) != 0 && !(isnan(e) && isnan(d[i]))) bad++;
  }
  LT_EQ(bad, 0);
  /* in place: dst is the first source */
  memcpy(d, a, M * sizeof(float));
  srcs[0] = d;
  loom__reduce(d, srcs, 2, M, LOOM_F32, LOOM_SUM);
  for (size_t i = 0; i < M; i++) {
    float e = a[i] + b[i];
    if (memcmp(&e, &d[i], 4) != 0 && !(isnan(e) && isnan(d[i]))) bad++;
  }
  LT_EQ(bad, 0);
  /* average of three: one f32 sum in source order, then one division */
  float *c = malloc(M * sizeof(float));
  LT_TRUE(c != NULL);
  fill(0, c, M);
  const void *three[3] = {a, b, c};
  loom__reduce(d, three, 3, M, LOOM_F32, LOOM_AVG);
  for (size_t i = 0; i < M; i++) {
    float e = (a[i] + b[i] + c[i]) / 3.0f;
    if (memcmp(&e, &d[i], 4) != 0 && !(isnan(e) && isnan(d[i]))) bad++;
  }
  LT_EQ(bad, 0);
  /* a power-of-two divisor (multiplied by its reciprocal inside) still gives the quotient's
   * bits, subnormal results included */
  for (size_t i = 0; i < M; i += 7) {
    a[i] = (i & 8) ? 1e-38f * (float)(i % 5) : -3e-39f;
    b[i] = c[i] = 1.5e-39f;
  }
  const void *four[4] = {a, b, c, a};
  loom__reduce(d, four, 4, M, LOOM_F32, LOOM_AVG);
  for (size_t i = 0; i < M; i++) {
    float e = (a[i] + b[i] + c[i] + a[i]) / 4.0f;
    if (memcmp(&e, &d[i], 4) != 0 && !(isnan(e) && isnan(d[i]))) bad++;
  }
  LT_EQ(bad, 0);
  free(a);
  free(b);
  free(c);
  free(d);
}
