/* bench_gemm_avx2.c: loom's own AVX2 GEMM for bf16 operands (src/ops/gemm_avx2.c) on the GPT
 * step's products (issue 25: 6 layers, 384 wide, context 256, batch 16 = 4096 rows), against
 * what the same product cost before it and what the f32 step pays, per shape, 1 thread:
 *   f32     OpenBLAS's sgemm on f32 operands (loom__gemm_f32_blas: the f32 step's product on
 *           an AVX2-only CPU);
 *   widened the bf16 operands widened to f32 copies, that sgemm, a bf16 C rounded from an f32
 *           copy (what loom__gemm did on an AVX2-only CPU before: gemm_dnnl.c's gemm_widened);
 *   avx2    loom__gemm_avx2 on the bf16 operands (what it does now).
 * Shapes as linear passes them (src/ops/matmul.c): forward NT with a bf16 C and the bias, the
 * input gradient NN and the weight gradient TN with an f32 C, for c_attn (384 -> 1152),
 * attn.c_proj (384 -> 384), mlp.c_fc (384 -> 1536), mlp.c_proj (1536 -> 384). The three sides
 * of a shape run one after another, ROUNDS times, and each side's median of the calling thread's
 * CPU time is reported, with the sum over the shapes (a layer's products). Before timing, the
 * avx2 product is checked against the f32 one (the same values; only the order of the sums
 * differs). Run it as an AVX2-only CPU would: LOOM_CPU=avx2 ONEDNN_MAX_CPU_ISA=AVX2
 * OPENBLAS_CORETYPE=Haswell (it says which OpenBLAS core it got).
 * Usage: bench_gemm_avx2 [rounds (default 5)]; BENCH_KIND=NT, NN or TN times that kind of
 * product only (the sum line is then over those). */
#include "bench_util.h"

#include "ops/gemm.h"
#include "ops/gemm_avx2.h"

enum { SIDES = 3, MAXR = 64 };

typedef bench_gemm_shape shape;
#define buf bench_buf

/* The product of shape s on one side; the bias (f32) and a bf16 C for the forward (NT). */
static double run(int side, const shape *s, const float *A, const float *B, const uint16_t *a,
                  const uint16_t *b, float *C, uint16_t *c, float *wa, float *wb,
                  const float *bias) {
  bool fwd = s->tb; /* linear's forward: bf16 C and the bias */
  loom__gemm_args g = {.trans_a = s->ta, .trans_b = s->tb, .batch = 1, .M = s->M, .N = s->N,
                       .K = s->K, .alpha = 1.0f, .lda = s->ta ? s->M : s->K,
                       .ldb = s->tb ? s->K : s->N, .ldc = s->N, .bias = fwd ? bias : NULL};
  size_t na = (size_t)(s->M * s->K), nb = (size_t)(s->K * s->N), nc = (size_t)(s->M * s->N);
  double t0 = bench_cpu_now();
  if (side == 0) {
    g.A = A, g.B = B, g.C = C, g.ab_dtype = g.c_dtype = LOOM_F32;
    BENCH_CHECK(loom__gemm_f32_blas(&g));
  } else if (side == 1) {
    loom_convert(a, LOOM_BF16, wa, LOOM_F32, na);
    loom_convert(b, LOOM_BF16, wb, LOOM_F32, nb);
    g.A = wa, g.B = wb, g.C = C, g.ab_dtype = g.c_dtype = LOOM_F32;
    BENCH_CHECK(loom__gemm_f32_blas(&g));
    if (fwd) loom_convert(C, LOOM_F32, c, LOOM_BF16, nc);
  } else {
    g.A = a, g.B = b, g.ab_dtype = LOOM_BF16, g.c_dtype = fwd ? LOOM_BF16 : LOOM_F32;
    g.C = fwd ? (void *)c : (void *)C;
    BENCH_CHECK(loom__gemm_avx2(&g));
  }
  return bench_cpu_now() - t0;
}

int main(int argc, char **argv) {
  int rounds = argc > 1 ? atoi(argv[1]) : 5;
  if (rounds < 1 || rounds > MAXR) rounds = 5;
  if (!loom_cpu_supports(LOOM_CPU_AVX2)) {
    printf("bench_gemm_avx2: this CPU has no AVX2; nothing to time\n");
    return 0;
  }
  loom_set_num_threads(1);
  const char *core = loom__blas_core();
  printf("# bench_gemm_avx2: 1 thread, %d rounds, CPU time; OpenBLAS core %s; LOOM_CPU=%s\n",
         rounds, core ? core : "(none)", getenv("LOOM_CPU") ? getenv("LOOM_CPU") : "unset");
  if (!core) {
    printf("bench_gemm_avx2: loom was built without OpenBLAS; nothing to compare\n");
    return 0;
  }
  const int64_t R = 4096, io[][2] = {{384, 1152}, {384, 384}, {384, 1536}, {1536, 384}};
  const char *names[] = {"c_attn", "attn.c_proj", "mlp.c_fc", "mlp.c_proj"};
  shape shapes[12];
  int ns = 0;
  for (int l = 0; l < 4; l++) {
    int64_t I = io[l][0], O = io[l][1];
    shapes[ns++] = (shape){names[l], R, O, I, false, true};  /* y = x W^T + b */
    shapes[ns++] = (shape){names[l], R, I, O, false, false}; /* gX = G W */
    shapes[ns++] = (shape){names[l], O, I, R, true, false};  /* gW = G^T X */
  }
  size_t big = (size_t)R * 1536;
  float *A = buf(big * 4), *B = buf(big * 4), *C = buf(big * 4), *C2 = buf(big * 4);
  float *wa = buf(big * 4), *wb = buf(big * 4), *bias = buf(1536 * 4);
  uint16_t *a = buf(big * 2), *b = buf(big * 2), *c = buf(big * 2);
  bench_gemm_operands(A, B, a, b, big, LOOM_BF16); /* the same values on every side */
  for (int i = 0; i < 1536; i++) bias[i] = 0.01f * (float)(i % 7);
  double sum[SIDES] = {0};
  printf("%-12s %-4s %5s %5s %5s | %9s %9s %9s | %s\n", "layer", "kind", "M", "N", "K",
         "f32 ms", "widened", "avx2", "avx2 GFLOP/s, widened/avx2, f32/avx2");
  const char *only = getenv("BENCH_KIND");
  for (int i = 0; i < ns; i++) {
    const shape *s = &shapes[i];
    if (only && strcmp(only, s->tb ? "NT" : s->ta ? "TN" : "NN") != 0) continue;
    size_t nc = (size_t)(s->M * s->N);
    /* the check: avx2 against f32 (an f32 C for it: the sums, before any rounding) */
    loom__gemm_args g = {.trans_a = s->ta, .trans_b = s->tb, .batch = 1, .M = s->M, .N = s->N,
                         .K = s->K, .alpha = 1.0f, .lda = s->ta ? s->M : s->K,
                         .ldb = s->tb ? s->K : s->N, .ldc = s->N};
    loom__gemm_args h = g;
    g.A = A, g.B = B, g.C = C, g.ab_dtype = g.c_dtype = LOOM_F32;
    h.A = a, h.B = b, h.C = C2, h.ab_dtype = LOOM_BF16, h.c_dtype = LOOM_F32;
    BENCH_CHECK(loom__gemm_f32_blas(&g));
    BENCH_CHECK(loom__gemm_avx2(&h));
    double worst = bench_gemm_rel_diff(C, C2, nc, s->K);
    if (worst > 1e-5) {
      fprintf(stderr, "bench_gemm_avx2: %s: avx2 differs from f32 by %.3g relative\n", s->what,
              worst);
      return 1;
    }
    double t[SIDES][MAXR];
    for (int k = 0; k < rounds; k++)
      for (int side = 0; side < SIDES; side++) t[side][k] = run(side, s, A, B, a, b, C, c, wa, wb, bias);
    double m[SIDES];
    for (int side = 0; side < SIDES; side++) sum[side] += m[side] = bench_median(t[side], rounds);
    printf("%-12s %-4s %5lld %5lld %5lld | %9.2f %9.2f %9.2f | %.1f, %.2f, %.2f\n", s->what,
           s->tb ? "NT" : s->ta ? "TN" : "NN", (long long)s->M, (long long)s->N, (long long)s->K,
           m[0] * 1e3, m[1] * 1e3, m[2] * 1e3, 2.0 * (double)s->M * s->N * s->K / m[2] * 1e-9,
           m[1] / m[2], m[0] / m[2]);
  }
  printf("%-30s | %9.2f %9.2f %9.2f | -, %.2f, %.2f\n", "a layer's 12 products", sum[0] * 1e3,
         sum[1] * 1e3, sum[2] * 1e3, sum[1] / sum[2], sum[0] / sum[2]);
  free(A), free(B), free(C), free(C2), free(wa), free(wb), free(bias), free(a), free(b), free(c);
  return 0;
}
