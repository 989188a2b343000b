/* test_gemm.c: loom__gemm (oneDNN) against loom__gemm_ref on many shapes: 1x1x1, odd sizes,
 * both transposes, padded leading dimensions, batches with a broadcast operand, alpha, beta
 * 0 and 1, in f32, bf16 and f16 with C in f32 or the input dtype; the reference itself
 * against hand-worked values; the primitive cache (hits, eviction, concurrent use); every
 * kind of bad argument; and the f32 OpenBLAS path (loom__gemm_f32_blas) on the same cases,
 * with the rule that chooses it (loom__gemm_prefer_blas).
 *
 * Tolerance: both sides sum the same exactly representable products (bf16 and f16 products
 * are exact in f32) in different orders, so each element may differ by the f32 summation
 * bound 2 (K + 2) 2^-24 sum_k |alpha a b| (+ |C|), computed per element by the reference on
 * absolute values; a bf16 or f16 C adds one ulp of the result's dtype (2^-7 or 2^-10
 * relative) for the final rounding. Inputs are generated in f32 and rounded to the dtype
 * once, and both sides read the same rounded inputs. */
#include "gemm_cases.h"
#include "lt.h"
#include "ops/gemm.h"
#include "ops/gemm_int.h"

#include <math.h>
#include <pthread.h>
#include <stdlib.h>

static uint64_t rng = 0x9e3779b97f4a7c15ull;
static float rnd(void) { /* uniform in [-1, 1) */
  rng = rng * 6364136223846793005ull + 1442695040888963407ull;
  return (float)((rng >> 40) & 0xffffff) / (float)(1 << 23) - 1.0f;
}

static void *rand_buf(loom_dtype dt, size_t n) {
  float *f = malloc((n ? n : 1) * sizeof *f);
  void *b = malloc((n ? n : 1) * loom_dtype_size(dt));
  for (size_t i = 0; i < n; i++) f[i] = rnd();
  loom_convert(f, LOOM_F32, b, dt, n);
  free(f);
  return b;
}

/* |x| of every element, same dtype (exact). */
static void *abs_buf(const void *src, loom_dtype dt, size_t n) {
  void *b = malloc((n ? n : 1) * loom_dtype_size(dt));
  for (size_t i = 0; i < n; i++) loom__store_f64(b, dt, i, fabs(loom__load_f64(src, dt, i)));
  return b;
}

static size_t span(int64_t batch, int64_t stride, int64_t rows, int64_t ld) {
  return (size_t)((batch - 1) * stride + rows * ld);
}

int check_with(gemm_fn kernel, shape s, loom_dtype ab, loom_dtype cdt) {
  loom__gemm_args g = {.trans_a = s.ta,
                       .trans_b = s.tb,
                       .batch = s.batch,
                       .M = s.M,
                       .N = s.N,
                       .K = s.K,
                       .alpha = s.alpha,
                       .beta = s.beta,
                       .ab_dtype = ab,
                       .c_dtype = cdt};
  int64_t ar = s.ta ? s.K : s.M, ac = s.ta ? s.M : s.K, br = s.tb ? s.N : s.K,
          bc = s.tb ? s.K : s.N;
  g.lda = ac + s.pad, g.ldb = bc + s.pad, g.ldc = s.N + s.pad;
  g.stride_a = s.bcast_a ? 0 : ar * g.lda + 3;
  g.stride_b = s.bcast_b ? 0 : br * g.ldb + 5;
  g.stride_c = s.M * g.ldc + 7;
  size_t na = span(s.batch, g.stride_a, ar, g.lda), nb = span(s.batch, g.stride_b, br, g.ldb);
  size_t nc = span(s.batch, g.stride_c, s.M, g.ldc);
  void *A = rand_buf(ab, na), *B = rand_buf(ab, nb), *C = rand_buf(cdt, nc);
  void *R = malloc(nc * loom_dtype_size(cdt)), *C0 = abs_buf(C, cdt, nc);
  memcpy(R, C, nc * loom_dtype_size(cdt));
  void *Aabs = abs_buf(A, ab, na), *Babs = abs_buf(B, ab, nb);
  float *mag = malloc(nc * sizeof *mag), *bias = NULL, *bias_abs = NULL;
  loom_convert(C0, cdt, mag, LOOM_F32, nc);
  if (s.bias) {
    bias = rand_buf(LOOM_F32, (size_t)s.N);
    bias_abs = abs_buf(bias, LOOM_F32, (size_t)s.N);
  }

  g.A = A, g.B = B, g.C = C, g.bias = bias;
  LT_OK(kernel(&g));
  loom__gemm_args r = g;
  r.C = R;
  LT_OK(loom__gemm_ref(&r));
  loom__gemm_args m = g;
  m.A = Aabs, m.B = Babs, m.C = mag, m.alpha = fabsf(s.alpha), m.c_dtype = LOOM_F32;
  m.bias = bias_abs;
  LT_OK(loom__gemm_ref(&m));

  double ulp = cdt == LOOM_BF16 ? 1.0 / 128 : cdt == LOOM_F16 ? 1.0 / 1024 : 0.0;
  double sub = cdt == LOOM_F16 ? 0x1p-24 : 0.0;
  int bad = 0;
  for (size_t i = 0; i < nc; i++) {
    double got = loom__load_f64(C, cdt, i), want = loom__load_f64(R, cdt, i);
    double tol = 2.0 * (double)(s.K + 2) * 0x1p-24 * mag[i] + ulp * fabs(want) + sub;
    if (fabs(got - want) <= tol) continue;
    if (!bad++)
      lt_fail_at(__FILE__, __LINE__,
                 "%s x %s -> %s, batch %lld M %lld N %lld K %lld ta %d tb %d pad %lld bcast %d%d "
                 "alpha %g beta %g bias %d: element %zu is %.9g, reference %.9g (tol %.3g)",
                 loom_dtype_name(ab), loom_dtype_name(ab), loom_dtype_name(cdt), (long long)s.batch,
                 (long long)s.M, (long long)s.N, (long long)s.K, s.ta, s.tb, (long long)s.pad,
                 s.bcast_a, s.bcast_b, (double)s.alpha, (double)s.beta, s.bias, i, got, want, tol);
  }
  free(A), free(B), free(C), free(R), free(C0), free(Aabs), free(Babs), free(mag);
  free(bias), free(bias_abs);
  return bad;
}

static int check_case(shape s, loom_dtype ab, loom_dtype cdt) {
  return check_with(loom__gemm, s, ab, cdt);
}

static const int64_t dims[][3] = {{1, 1, 1},    {1, 7, 3},      {5, 1, 9},  {17, 33, 65},
                                  {64, 64, 64}, {129, 31, 257}, {3, 200, 2}};
#define NDIMS (int)(sizeof dims / sizeof dims[0])

void sweep_dims(gemm_fn kernel, const int64_t (*sizes)[3], int n, loom_dtype ab, loom_dtype cdt) {
  static const float alphas[] = {1.0f, 0.5f, -2.0f};
  int i = 0;
  for (int d = 0; d < n; d++)
    for (int t = 0; t < 4; t++, i++) {
      shape s = {1,     sizes[d][0],   sizes[d][1],          sizes[d][2],
                 t & 1, (t >> 1) & 1,  (i % 3 == 1) ? 3 : 0, false,
                 false, alphas[i % 3], (float)(i % 2), false};
      check_with(kernel, s, ab, cdt);
    }
}

void sweep_with(gemm_fn kernel, loom_dtype ab, loom_dtype cdt) {
  sweep_dims(kernel, dims, NDIMS, ab, cdt);
}

const loom_dtype gemm_dtype_pairs[GEMM_DTYPE_PAIRS][2] = {
    {LOOM_BF16, LOOM_F32}, {LOOM_BF16, LOOM_BF16}, {LOOM_F16, LOOM_F32},
    {LOOM_F16, LOOM_F16},  {LOOM_F32, LOOM_F32}};

void check_packed_blocks(gemm_fn kernel) {
  const shape shapes[] = {
      {1, 200, 40, 600, false, true, 0, false, false, 1.0f, 0.0f, true},
      {1, 101, 45, 777, true, false, 1, false, false, 1.0f, 1.0f, false},
      {1, 13, 1600, 300, false, false, 0, false, false, 0.5f, 1.0f, false},
      {1, 7, 500, 3000, true, true, 3, false, false, 1.0f, 0.0f, true},
      {2, 98, 33, 520, false, false, 0, false, true, 1.0f, 1.0f, false},
      {1, 256, 70, 257, true, true, 0, false, false, 1.0f, 1.0f, false},
      {1, 61, 97, 1100, false, true, 2, false, false, 1.0f, 1.0f, true},
  };
  for (size_t i = 0; i < sizeof shapes / sizeof *shapes; i++)
    for (int p = 0; p < GEMM_DTYPE_PAIRS; p++)
      LT_EQ(check_with(kernel, shapes[i], gemm_dtype_pairs[p][0], gemm_dtype_pairs[p][1]), 0);
  int before = loom__gemm_threads(); /* row blocks split over two threads */
  loom__gemm_set_threads(2);
  shape s = {2, 300, 130, 400, false, true, 0, false, false, 1.0f, 1.0f, true};
  LT_EQ(check_with(kernel, s, LOOM_BF16, LOOM_BF16), 0);
  LT_EQ(check_with(kernel, s, LOOM_F16, LOOM_F32), 0);
  loom__gemm_set_threads(before);
}

void check_c_rounding(gemm_fn kernel, int64_t M) {
  enum { N = 45 };
  float bias[N];
  for (int j = 0; j < N; j++) bias[j] = ldexpf(1.0f + (float)j * 0x1p-12f, j % 9 - 4);
  bias[0] = 1.0f + 0x1p-8f;     /* a bf16 tie: to even (down) */
  bias[1] = 1.0f + 3 * 0x1p-8f; /* a bf16 tie: to even (up) */
  bias[2] = 1.0f + 0x1p-11f;    /* an f16 tie */
  bias[3] = NAN, bias[4] = -INFINITY, bias[5] = 0x1p-130f, bias[6] = -0x1p-20f;
  bias[7] = 3.4e38f; /* near the top of f32's range (f16: overflows to inf) */
  bias[40] = -NAN, bias[41] = 0x1p-140f, bias[42] = 1.0f + 0x1p-8f, bias[43] = 65520.0f;
  for (int d = 0; d < 2; d++) {
    loom_dtype dt = d ? LOOM_F16 : LOOM_BF16;
    uint16_t *A = calloc((size_t)M, 2), B[N] = {0}, *C = malloc((size_t)(M * N) * 2), want[N];
    loom__gemm_args g = {.batch = 1, .M = M, .N = N, .K = 1, .alpha = 1, .A = A, .lda = 1,
                         .B = B, .ldb = N, .C = C, .ldc = N, .ab_dtype = dt, .c_dtype = dt,
                         .bias = bias};
    LT_OK(kernel(&g));
    loom_convert(bias, LOOM_F32, want, dt, N);
    for (int64_t i = 0; i < M; i++)
      for (int j = 0; j < N; j++) LT_EQ_HEX(C[i * N + j], want[j]);
    free(A), free(C);
  }
}

void check_kernel_errors(gemm_fn kernel, const char *who) {
  uint16_t A[4] = {0}, B[4] = {0}, C[4] = {0};
  loom__gemm_args g = {.batch = 1, .M = 2, .N = 2, .K = 2, .alpha = 1, .A = A, .lda = 2,
                       .B = B, .ldb = 2, .C = C, .ldc = 2, .ab_dtype = LOOM_BF16,
                       .c_dtype = LOOM_BF16};
  LT_OK(kernel(&g));
  LT_ERR(kernel(NULL), LOOM_EINVAL, who);
  loom__gemm_args b = g;
  b.A = NULL;
  LT_ERR(kernel(&b), LOOM_EINVAL, "A is NULL");
  b = g, b.B = NULL;
  LT_ERR(kernel(&b), LOOM_EINVAL, "B is NULL");
  b = g, b.lda = 1;
  LT_ERR(kernel(&b), LOOM_ESHAPE, "leading dimension 1 of A");
  b = g, b.ldc = 1;
  LT_ERR(kernel(&b), LOOM_ESHAPE, "leading dimension 1 of C");
  b = g, b.beta = 0.5f;
  LT_ERR(kernel(&b), LOOM_EINVAL, "beta");
  b = g, b.c_dtype = LOOM_I32;
  LT_ERR(kernel(&b), LOOM_EDTYPE, who);
  b = g, b.ab_dtype = LOOM_I64;
  LT_ERR(kernel(&b), LOOM_EDTYPE, who);
  b = g, b.c_dtype = LOOM_F16; /* C f16 with bf16 operands */
  LT_ERR(kernel(&b), LOOM_EDTYPE, who);
  b = g, b.ab_dtype = LOOM_F16, b.c_dtype = LOOM_BF16; /* C bf16 with f16 operands */
  LT_ERR(kernel(&b), LOOM_EDTYPE, who);
}

static void sweep(loom_dtype ab, loom_dtype cdt) { sweep_with(loom__gemm, ab, cdt); }

LT_TEST(gemm_matches_ref_f32) {
  sweep(LOOM_F32, LOOM_F32);
}
LT_TEST(gemm_matches_ref_bf16_to_f32) {
  sweep(LOOM_BF16, LOOM_F32);
}
LT_TEST(gemm_matches_ref_bf16_to_bf16) {
  sweep(LOOM_BF16, LOOM_BF16);
}
LT_TEST(gemm_matches_ref_f16_to_f32) {
  sweep(LOOM_F16, LOOM_F32);
}
LT_TEST(gemm_matches_ref_f16_to_f16) {
  sweep(LOOM_F16, LOOM_F16);
}

LT_TEST(gemm_batched_with_broadcast) {
  const loom_dtype pairs[][2] = {
      {LOOM_F32, LOOM_F32}, {LOOM_BF16, LOOM_BF16}, {LOOM_BF16, LOOM_F32}, {LOOM_F16, LOOM_F16}};
  for (int p = 0; p < 4; p++)
    for (int bc = 0; bc < 3; bc++) /* none, A broadcast, B broadcast */
      for (int t = 0; t < 4; t++) {
        shape s = {4,
                   9,
                   13,
                   21,
                   t & 1,
                   (t >> 1) & 1,
                   t == 3 ? 2 : 0,
                   bc == 1,
                   bc == 2,
                   t == 2 ? 0.25f : 1.0f,
                   (float)(t & 1), false};
        check_case(s, pairs[p][0], pairs[p][1]);
      }
  /* both broadcast: every batch of C gets the same product */
  shape s = {3, 5, 6, 7, false, false, 0, true, true, 1.0f, 0.0f, false};
  check_case(s, LOOM_F32, LOOM_F32);
}

LT_TEST(gemm_with_bias) {
  /* the f32 bias row added before C's rounding, every dtype pair, 2-D and batched (with a
   * broadcast operand), beta 0 and 1 */
  const loom_dtype pairs[][2] = {{LOOM_F32, LOOM_F32},   {LOOM_BF16, LOOM_BF16},
                                 {LOOM_BF16, LOOM_F32},  {LOOM_F16, LOOM_F16},
                                 {LOOM_F16, LOOM_F32}};
  for (int p = 0; p < 5; p++)
    for (int t = 0; t < 8; t++) {
      shape s = {t & 4 ? 3 : 1, 17, 33, 65, t & 1, false, 0, false, (t & 4) && (t & 1), 1.0f,
                 (float)((t >> 1) & 1), true};
      check_case(s, pairs[p][0], pairs[p][1]);
    }
  float A[1] = {1}, B[1] = {1}, C[1], bias[1] = {1};
  loom__gemm_args g = {.batch = 1, .M = 1, .N = 1, .K = 1, .alpha = 2, .A = A, .lda = 1,
                       .B = B, .ldb = 1, .C = C, .ldc = 1, .ab_dtype = LOOM_F32,
                       .c_dtype = LOOM_F32, .bias = bias};
  LT_ERR(loom__gemm(&g), LOOM_EINVAL, "a bias needs alpha 1");
  LT_ERR(loom__gemm_ref(&g), LOOM_EINVAL, "a bias needs alpha 1");
}

/* The reference against values worked by hand: A = [1 2; 3 4], B = [5 6; 7 8]. */
LT_TEST(gemm_ref_hand_values) {
  float A[] = {1, 2, 3, 4}, B[] = {5, 6, 7, 8}, C[4] = {1, 1, 1, 1};
  loom__gemm_args g = {.batch = 1,
                       .M = 2,
                       .N = 2,
                       .K = 2,
                       .alpha = 1,
                       .beta = 0,
                       .A = A,
                       .lda = 2,
                       .B = B,
                       .ldb = 2,
                       .C = C,
                       .ldc = 2,
                       .ab_dtype = LOOM_F32,
                       .c_dtype = LOOM_F32};
  LT_OK(loom__gemm_ref(&g));
  LT_EQ(C[0], 19);
  LT_EQ(C[1], 22);
  LT_EQ(C[2], 43);
  LT_EQ(C[3], 50);
  g.trans_a = true; /* A^T = [1 3; 2 4] */
  LT_OK(loom__gemm_ref(&g));
  LT_EQ(C[0], 26);
  LT_EQ(C[1], 30);
  LT_EQ(C[2], 38);
  LT_EQ(C[3], 44);
  g.trans_a = false, g.trans_b = true, g.alpha = 2, g.beta = 1; /* C += 2 A B^T, B^T = [5 7; 6 8] */
  LT_OK(loom__gemm_ref(&g));
  LT_EQ(C[0], 26 + 34);
  LT_EQ(C[1], 30 + 46);
  LT_EQ(C[2], 38 + 78);
  LT_EQ(C[3], 44 + 106);
  /* and the kernel gives exactly these small integers too */
  float D[4] = {26, 30, 38, 44};
  g.C = D;
  LT_OK(loom__gemm(&g));
  for (int i = 0; i < 4; i++) LT_EQ(D[i], C[i]);
}

LT_TEST(gemm_beta_one_accumulates) {
  float A[6], B[12], C[8] = {0}, R[8] = {0};
  for (int i = 0; i < 6; i++) A[i] = (float)(i + 1);
  for (int i = 0; i < 12; i++) B[i] = (float)(i % 5 - 2);
  loom__gemm_args g = {.batch = 1,
                       .M = 2,
                       .N = 4,
                       .K = 3,
                       .alpha = 1,
                       .beta = 0,
                       .A = A,
                       .lda = 3,
                       .B = B,
                       .ldb = 4,
                       .C = R,
                       .ldc = 4,
                       .ab_dtype = LOOM_F32,
                       .c_dtype = LOOM_F32};
  LT_OK(loom__gemm(&g));
  g.C = C, g.beta = 1;
  for (int k = 0; k < 3; k++) LT_OK(loom__gemm(&g));
  for (int i = 0; i < 8; i++) LT_EQ(C[i], 3 * R[i]);
}

LT_TEST(gemm_cache_hits_and_evicts) {
  loom__prim_cache_info before, after;
  shape s = {1, 11, 12, 13, false, true, 1, false, false, 1.0f, 0.0f, false};
  check_case(s, LOOM_F32, LOOM_F32);
  loom__prim_cache_stats(&before);
  check_case(s, LOOM_F32, LOOM_F32);
  loom__prim_cache_stats(&after);
  LT_EQ(after.hits, before.hits + 1);
  LT_EQ(after.misses, before.misses);
  /* a capacity of 2 keeps the two most recent shapes and still computes right */
  int64_t cap = before.capacity;
  LT_OK(loom__prim_cache_set_capacity(2));
  loom__prim_cache_stats(&after);
  LT_TRUE(after.entries <= 2);
  for (int i = 0; i < 4; i++) {
    shape t = {1, 3 + i, 4, 5, false, false, 0, false, false, 1.0f, 0.0f, false};
    LT_EQ(check_case(t, LOOM_F32, LOOM_F32), 0);
  }
  loom__prim_cache_stats(&after);
  LT_EQ(after.entries, 2);
  LT_TRUE(after.evictions > before.evictions);
  LT_ERR(loom__prim_cache_set_capacity(0), LOOM_EINVAL, "capacity 0");
  LT_ERR(loom__prim_cache_set_capacity(LOOM__PRIM_CACHE_MAX + 1), LOOM_EINVAL, "capacity");
  LT_OK(loom__prim_cache_set_capacity(cap));
}

/* Threads (as ranks would be) multiply concurrently with one oneDNN thread each, through a
 * tiny cache so that entries are evicted while other threads run them. */
static void *worker(void *arg) {
  int id = (int)(intptr_t)arg;
  loom__gemm_set_threads(1);
  int bad = 0;
  for (int it = 0; it < 6; it++) {
    int64_t m = 8 + (id + it) % 3; /* shapes shared between threads */
    int64_t n = 40 + 8 * id, k = 33;
    float *A = malloc(sizeof(float) * (size_t)(m * k)),
          *B = malloc(sizeof(float) * (size_t)(k * n));
    float *C = malloc(sizeof(float) * (size_t)(m * n)),
          *R = malloc(sizeof(float) * (size_t)(m * n));
    for (int64_t i = 0; i < m * k; i++) A[i] = (float)((i * 7 + id) % 13) - 6;
    for (int64_t i = 0; i < k * n; i++) B[i] = (float)((i * 5 + it) % 11) - 5;
    loom__gemm_args g = {.batch = 1,
                         .M = m,
                         .N = n,
                         .K = k,
                         .alpha = 1,
                         .beta = 0,
                         .A = A,
                         .lda = k,
                         .B = B,
                         .ldb = n,
                         .C = C,
                         .ldc = n,
                         .ab_dtype = LOOM_F32,
                         .c_dtype = LOOM_F32};
    if (loom__gemm(&g) != LOOM_OK) bad++;
    g.C = R;
    loom__gemm_ref(&g);
    for (int64_t i = 0; i < m * n; i++) bad += C[i] != R[i]; /* small integers: exact */
    free(A), free(B), free(C), free(R);
  }
  return (void *)(intptr_t)bad;
}

LT_TEST(gemm_concurrent_threads) {
  loom__prim_cache_info info;
  loom__prim_cache_stats(&info);
  LT_OK(loom__prim_cache_set_capacity(2));
  pthread_t t[4];
  for (int i = 0; i < 4; i++) pthread_create(&t[i], NULL, worker, (void *)(intptr_t)i);
  for (int i = 0; i < 4; i++) {
    void *bad;
    pthread_join(t[i], &bad);
    LT_EQ((intptr_t)bad, 0);
  }
  LT_OK(loom__prim_cache_set_capacity(info.capacity));
}

/* With two oneDNN threads (a new cache key) the results still match the reference. */
LT_TEST(gemm_two_threads) {
  int before = loom__gemm_threads();
  loom__gemm_set_threads(2);
  shape s = {2, 96, 130, 200, false, true, 0, false, false, 1.0f, 1.0f, false};
  LT_EQ(check_case(s, LOOM_F32, LOOM_F32), 0);
  LT_EQ(check_case(s, LOOM_BF16, LOOM_BF16), 0);
  loom__gemm_set_threads(1);
  LT_EQ(check_case(s, LOOM_F32, LOOM_F32), 0);
  loom__gemm_set_threads(before);
}

LT_TEST(gemm_bad_arguments) {
  float A[16] = {0}, B[16] = {0}, C[16] = {0};
  const loom__gemm_args ok = {.batch = 1,
                              .M = 2,
                              .N = 2,
                              .K = 2,
                              .alpha = 1,
                              .beta = 0,
                              .A = A,
                              .lda = 2,
                              .B = B,
                              .ldb = 2,
                              .C = C,
                              .ldc = 2,
                              .ab_dtype = LOOM_F32,
                              .c_dtype = LOOM_F32};
  int (*fns[])(const loom__gemm_args *) = {loom__gemm, loom__gemm_ref};
  const char *names[] = {"loom__gemm:", "loom__gemm_ref:"};
  for (int f = 0; f < 2; f++) {
    loom__gemm_args g;
    LT_ERR(fns[f](NULL), LOOM_EINVAL, "args is NULL");
    LT_ERR(fns[f](NULL), LOOM_EINVAL, names[f]);
    g = ok, g.A = NULL;
    LT_ERR(fns[f](&g), LOOM_EINVAL, "A is NULL");
    g = ok, g.B = NULL;
    LT_ERR(fns[f](&g), LOOM_EINVAL, "B is NULL");
    g = ok, g.C = NULL;
    LT_ERR(fns[f](&g), LOOM_EINVAL, "C is NULL");
    g = ok, g.M = 0;
    LT_ERR(fns[f](&g), LOOM_EINVAL, "M must be positive, got 0");
    g = ok, g.N = -3;
    LT_ERR(fns[f](&g), LOOM_EINVAL, "N must be positive, got -3");
    g = ok, g.K = 0;
    LT_ERR(fns[f](&g), LOOM_EINVAL, "K must be positive");
    g = ok, g.batch = 0;
    LT_ERR(fns[f](&g), LOOM_EINVAL, "batch must be positive");
    g = ok, g.ab_dtype = LOOM_I32;
    LT_ERR(fns[f](&g), LOOM_EDTYPE, "A and B dtype i32 is not supported");
    g = ok, g.ab_dtype = (loom_dtype)99;
    LT_ERR(fns[f](&g), LOOM_EDTYPE, "is not supported");
    g = ok, g.c_dtype = LOOM_BF16; /* f32 inputs into a bf16 C */
    LT_ERR(fns[f](&g), LOOM_EDTYPE, "C dtype bf16 is not supported with f32 inputs");
    g = ok, g.ab_dtype = LOOM_F16, g.c_dtype = LOOM_BF16;
    LT_ERR(fns[f](&g), LOOM_EDTYPE, "C dtype bf16");
    g = ok, g.beta = 0.5f;
    LT_ERR(fns[f](&g), LOOM_EINVAL, "beta must be 0 or 1, got 0.5");
    g = ok, g.lda = 1;
    LT_ERR(fns[f](&g), LOOM_ESHAPE, "leading dimension 1 of A is less than its row length 2");
    g = ok, g.trans_b = true, g.K = 3, g.lda = 3, g.ldb = 2; /* B stored [N, K] needs ldb >= 3 */
    LT_ERR(fns[f](&g), LOOM_ESHAPE, "leading dimension 2 of B");
    g = ok, g.ldc = 0;
    LT_ERR(fns[f](&g), LOOM_ESHAPE, "of C");
    g = ok, g.batch = 2, g.stride_a = 4, g.stride_b = 4, g.stride_c = 3;
    LT_ERR(fns[f](&g), LOOM_ESHAPE, "batch stride 3 of C is too small");
    g = ok, g.batch = 2, g.stride_a = -4, g.stride_b = 4, g.stride_c = 4;
    LT_ERR(fns[f](&g), LOOM_ESHAPE, "batch stride -4 of A is negative");
  }
}

LT_TEST(gemm_backend_errors_map_to_ebackend) {
  LT_ERR(loom__dnnl_check(dnnl_unimplemented, "loom__gemm", "matmul primitive descriptor"),
         LOOM_EBACKEND, "loom__gemm: oneDNN matmul primitive descriptor failed: unimplemented");
  LT_ERR(loom__dnnl_check(dnnl_invalid_arguments, "x", "y"), LOOM_EBACKEND, "invalid_arguments");
  LT_ERR(loom__dnnl_check(dnnl_out_of_memory, "x", "y"), LOOM_ENOMEM, "out_of_memory");
  LT_OK(loom__dnnl_check(dnnl_success, "x", "y"));
}

/* Out of memory in the f16 path (its f32 copies) and in the scratchpad: a clean LOOM_ENOMEM,
 * nothing leaked, and the next call works. */
LT_TEST(gemm_out_of_memory_is_clean) {
  shape s = {2, 40, 50, 60, false, false, 0, false, false, 1.0f, 1.0f, false};
  for (uint64_t n = 1; n <= 4; n++) {
    uint16_t *A = rand_buf(LOOM_F16, 2 * 40 * 60), *B = rand_buf(LOOM_F16, 2 * 60 * 50);
    uint16_t *C = rand_buf(LOOM_F16, 2 * 40 * 50);
    loom__gemm_args g = {.batch = 2,
                         .M = 40,
                         .N = 50,
                         .K = 60,
                         .alpha = 1,
                         .beta = 1,
                         .A = A,
                         .lda = 60,
                         .stride_a = 2400,
                         .B = B,
                         .ldb = 50,
                         .stride_b = 3000,
                         .C = C,
                         .ldc = 50,
                         .stride_c = 2000,
                         .ab_dtype = LOOM_F16,
                         .c_dtype = LOOM_F16};
    loom_pool_stats before, after;
    loom_mem_stats(LOOM_POOL_COMPUTE, &before);
    loom_alloc_fail_nth(n);
    int rc = loom__gemm(&g);
    loom_alloc_fail_nth(0);
    loom_mem_stats(LOOM_POOL_COMPUTE, &after);
    LT_TRUE(rc == LOOM_OK || rc == LOOM_ENOMEM);
    if (rc == LOOM_ENOMEM) LT_TRUE(strstr(loom_last_error(), "loom__gemm") != NULL);
    LT_EQ(after.current_bytes, before.current_bytes);
    free(A), free(B), free(C);
  }
  LT_EQ(check_case(s, LOOM_F16, LOOM_F16), 0);
}

/* ---- the f32 OpenBLAS path (gemm_blas.c) --------------------------------------------- */

/* Whether loom was built with OpenBLAS (else the test is skipped). */
static bool have_blas(void) {
  float A[1] = {2}, B[1] = {3}, C[1] = {0};
  loom__gemm_args g = {.batch = 1, .M = 1, .N = 1, .K = 1, .alpha = 1, .A = A, .lda = 1,
                       .B = B, .ldb = 1, .C = C, .ldc = 1, .ab_dtype = LOOM_F32,
                       .c_dtype = LOOM_F32};
  int rc = loom__gemm_f32_blas(&g);
  if (rc == LOOM_ENOSYS) lt_skip("loom was built without OpenBLAS");
  return rc == LOOM_OK && C[0] == 6;
}

LT_TEST(gemm_blas_matches_ref) {
  if (!have_blas()) return;
  sweep_with(loom__gemm_f32_blas, LOOM_F32, LOOM_F32);
  for (int bc = 0; bc < 4; bc++) /* batches: none, A, B, both broadcast */
    for (int t = 0; t < 4; t++) {
      shape s = {4,      9,       13, 21, t & 1, (t >> 1) & 1, t == 3 ? 2 : 0, bc & 1, bc >> 1,
                 t == 2 ? 0.25f : 1.0f, (float)(t & 1), false};
      LT_EQ(check_with(loom__gemm_f32_blas, s, LOOM_F32, LOOM_F32), 0);
    }
  for (int t = 0; t < 8; t++) { /* bias, beta 0 and 1, 2-D and batched */
    shape s = {t & 4 ? 3 : 1, 17, 33, 65, t & 1, false, 0, false, (t & 4) && (t & 1), 1.0f,
               (float)((t >> 1) & 1), true};
    LT_EQ(check_with(loom__gemm_f32_blas, s, LOOM_F32, LOOM_F32), 0);
  }
  /* an MLP layer's three products as linear passes them (forward NT + bias, weight gradient
   * TN with beta 1, input gradient NN), at a size where the rule picks OpenBLAS */
  shape fwd = {1, 64, 96, 80, false, true, 0, false, false, 1.0f, 0.0f, true};
  shape dw = {1, 96, 80, 64, true, false, 0, false, false, 1.0f, 1.0f, false};
  shape dx = {1, 64, 80, 96, false, false, 0, false, false, 1.0f, 0.0f, false};
  LT_EQ(check_with(loom__gemm_f32_blas, fwd, LOOM_F32, LOOM_F32), 0);
  LT_EQ(check_with(loom__gemm_f32_blas, dw, LOOM_F32, LOOM_F32), 0);
  LT_EQ(check_with(loom__gemm_f32_blas, dx, LOOM_F32, LOOM_F32), 0);
}

LT_TEST(gemm_blas_bad_arguments) {
  float A[4] = {0}, B[4] = {0}, C[4] = {0}, bias[2] = {0};
  const loom__gemm_args ok = {.batch = 1, .M = 2, .N = 2, .K = 2, .alpha = 1, .A = A,
                              .lda = 2, .B = B, .ldb = 2, .C = C, .ldc = 2,
                              .ab_dtype = LOOM_F32, .c_dtype = LOOM_F32};
  loom__gemm_args g;
  LT_ERR(loom__gemm_f32_blas(NULL), LOOM_EINVAL, "loom__gemm_f32_blas: args is NULL");
  g = ok, g.A = NULL; /* the checks loom__gemm makes, with their messages */
  LT_ERR(loom__gemm_f32_blas(&g), LOOM_EINVAL, "A is NULL");
  g = ok, g.beta = 0.5f;
  LT_ERR(loom__gemm_f32_blas(&g), LOOM_EINVAL, "beta must be 0 or 1");
  g = ok, g.lda = 1;
  LT_ERR(loom__gemm_f32_blas(&g), LOOM_ESHAPE, "leading dimension 1 of A");
  g = ok, g.bias = bias, g.alpha = 2;
  LT_ERR(loom__gemm_f32_blas(&g), LOOM_EINVAL, "a bias needs alpha 1");
  if (!have_blas()) return;
  g = ok, g.ab_dtype = LOOM_BF16, g.c_dtype = LOOM_F32;
  LT_ERR(loom__gemm_f32_blas(&g), LOOM_EDTYPE, "takes f32 A, B and C, got bf16 x bf16 -> f32");
  g = ok, g.ab_dtype = LOOM_F16, g.c_dtype = LOOM_F16;
  LT_ERR(loom__gemm_f32_blas(&g), LOOM_EDTYPE, "f16");
  g = ok, g.M = (int64_t)1 << 32, g.ldc = 2; /* larger than OpenBLAS's int (never read) */
  LT_ERR(loom__gemm_f32_blas(&g), LOOM_EOVERFLOW, "exceeds OpenBLAS's int");
}

/* The rule: only f32, only for a calling thread with one GEMM thread, never for a tiny
 * dimension, only where oneDNN's f32 is below AVX-512 and OpenBLAS runs AVX2 kernels (not a
 * fallback core); the modes override the CPU and size parts, not eligibility. */
LT_TEST(gemm_blas_choice) {
  float x[1] = {0};
  loom__gemm_args g = {.batch = 1, .M = 256, .N = 1024, .K = 1024, .alpha = 1, .A = x,
                       .lda = 1024, .B = x, .ldb = 1024, .C = x, .ldc = 1024,
                       .ab_dtype = LOOM_F32, .c_dtype = LOOM_F32};
  int threads = loom__gemm_threads();
  loom__gemm_set_threads(1);
  loom__gemm_blas_set_mode(LOOM__GEMM_BLAS_NEVER);
  LT_TRUE(!loom__gemm_prefer_blas(&g)); /* (the rule only: x is too small to run g) */
  loom__gemm_blas_set_mode(LOOM__GEMM_BLAS_ALWAYS);
  bool eligible = loom__gemm_prefer_blas(&g); /* built with OpenBLAS, not under TSan */
  loom__gemm_args h = g;
  h.ab_dtype = LOOM_BF16;
  LT_TRUE(!loom__gemm_prefer_blas(&h));
  h = g, h.c_dtype = LOOM_BF16;
  LT_TRUE(!loom__gemm_prefer_blas(&h));
  h = g, h.M = 10; /* ALWAYS ignores the size rule */
  LT_EQ(loom__gemm_prefer_blas(&h), eligible);
  loom__gemm_set_threads(2);
  LT_TRUE(!loom__gemm_prefer_blas(&g));
  loom__gemm_set_threads(1);
  loom__gemm_blas_set_mode(LOOM__GEMM_BLAS_AUTO);
  dnnl_engine_t eng;
  LT_OK(loom__dnnl_engine("test", &eng));
  bool avx512 = (dnnl_get_effective_cpu_isa() & dnnl_cpu_isa_avx512_core) ==
                dnnl_cpu_isa_avx512_core;
  bool auto_blas = eligible && !avx512 && loom__blas_core_has_avx2(loom__blas_core());
  LT_EQ(loom__gemm_prefer_blas(&g), auto_blas);
  for (int d = 0; d < 3; d++) { /* 16 is tiny, 17 is not */
    h = g;
    int64_t *dim = d == 0 ? &h.M : d == 1 ? &h.N : &h.K;
    *dim = 16;
    LT_TRUE(!loom__gemm_prefer_blas(&h));
    *dim = 17;
    LT_EQ(loom__gemm_prefer_blas(&h), auto_blas);
  }
  loom__gemm_blas_set_mode(LOOM__GEMM_BLAS_FROM_ENV);
  loom__gemm_set_threads(threads);
}

/* OpenBLAS's cores: those with AVX2 or AVX-512 kernels (any case), not the fallbacks it picks
 * on a CPU its table does not know. */
LT_TEST(gemm_blas_core_names) {
  const char *fast[] = {"Haswell", "ZEN", "SkylakeX", "Cooperlake", "sapphirerapids"};
  const char *slow[] = {"Prescott", "Core2", "Nehalem", "Sandybridge", "Unknown", "", "Haswel",
                        "SkylakeX2", NULL};
  for (size_t i = 0; i < sizeof fast / sizeof *fast; i++) LT_TRUE(loom__blas_core_has_avx2(fast[i]));
  for (size_t i = 0; i < sizeof slow / sizeof *slow; i++) LT_TRUE(!loom__blas_core_has_avx2(slow[i]));
}

/* bf16 kernels chosen by speed (issue 27): AMX kernels and non-Intel CPUs natively, an Intel
 * CPU without AMX widened to f32 (unless LOOM_BF16_KERNELS overrides the table). */
LT_TEST(gemm_bf16_kernel_rule) {
  if (getenv("LOOM_BF16_KERNELS")) return; /* the override answers instead of the table */
  LT_TRUE(loom__bf16_kernel_fast(true, true));  /* Sapphire/Emerald Rapids with AMX */
  LT_TRUE(!loom__bf16_kernel_fast(false, true)); /* Intel without AMX */
  LT_TRUE(loom__bf16_kernel_fast(false, false)); /* AMD Zen 4, Zen 5 */
}
