/* bench_gemm_avx512.c: loom's own AVX-512 GEMM for 16-bit operands (src/ops/gemm_avx512.c) on
 * the products of the MLP step (784-1024-1024-10, batch 256) or the GPT step (6 layers, 384
 * wide, 4096 rows), against what the same product cost before it and what the f32 step pays,
 * per shape, 1 thread:
 *   f32     loom__gemm on f32 operands (oneDNN's f32 kernel: the f32 step's product);
 *   widened the 16-bit operands widened to f32 copies, that kernel, a 16-bit C rounded from an
 *           f32 copy (what loom__gemm does without this GEMM: gemm_dnnl.c's gemm_widened);
 *   avx512  loom__gemm_avx512 on the 16-bit operands (what loom__gemm does with it).
 * Shapes as linear passes them (src/ops/matmul.c): the forward NT with a 16-bit C and the bias,
 * the input gradient NN and the weight gradient TN with an f32 C (the MLP's first layer has no
 * input gradient). The three sides of a shape run one after another, ROUNDS times, and each
 * side's median of the calling thread's CPU time is reported, with the sum over the shapes.
 * Before timing, the avx512 product is checked against the f32 one (the same values; only the
 * order of the sums differs). The CPU issue 27 measured without AMX is reproduced with
 * ONEDNN_MAX_CPU_ISA=AVX512_CORE_BF16 (the f32 kernel is the same either way).
 * Usage: bench_gemm_avx512 [rounds (default 5)] [bf16|f16] [mlp|gpt] */
#include "bench_util.h"

#include "ops/gemm.h"
#include "ops/gemm_avx512.h"


enum { SIDES = 3, MAXR = 64, MAXS = 12 };

typedef bench_gemm_shape shape;
#define buf bench_buf

typedef struct sides {
  loom_dtype dt;
  const float *A, *B, *bias;
  const uint16_t *a, *b;
  float *C, *wa, *wb;
  uint16_t *c;
} sides;

/* The product of shape s on one side; the bias (f32) and a 16-bit C for the forward (NT). */
static double run(int side, const shape *s, const sides *d) {
  bool fwd = s->tb; /* linear's forward: a 16-bit C and the bias */
  loom__gemm_args g = {.trans_a = s->ta, .trans_b = s->tb, .batch = 1, .M = s->M, .N = s->N,
                       .K = s->K, .alpha = 1.0f, .lda = s->ta ? s->M : s->K,
                       .ldb = s->tb ? s->K : s->N, .ldc = s->N, .bias = fwd ? d->bias : NULL};
  size_t na = (size_t)(s->M * s->K), nb = (size_t)(s->K * s->N), nc = (size_t)(s->M * s->N);
  double t0 = bench_cpu_now();
  if (side == 0) {
    g.A = d->A, g.B = d->B, g.C = d->C, g.ab_dtype = g.c_dtype = LOOM_F32;
    BENCH_CHECK(loom__gemm(&g));
  } else if (side == 1) {
    loom_convert(d->a, d->dt, d->wa, LOOM_F32, na);
    loom_convert(d->b, d->dt, d->wb, LOOM_F32, nb);
    g.A = d->wa, g.B = d->wb, g.C = d->C, g.ab_dtype = g.c_dtype = LOOM_F32;
    BENCH_CHECK(loom__gemm(&g));
    if (fwd) loom_convert(d->C, LOOM_F32, d->c, d->dt, nc);
  } else {
    g.A = d->a, g.B = d->b, g.ab_dtype = d->dt, g.c_dtype = fwd ? d->dt : LOOM_F32;
    g.C = fwd ? (void *)d->c : (void *)d->C;
    BENCH_CHECK(loom__gemm_avx512(&g));
  }
  return bench_cpu_now() - t0;
}

/* The check before timing: the avx512 product of the 16-bit operands (f32 C, the sums before
 * any rounding) is oneDNN's f32 product of their values up to the order of the sums, and bit
 * for bit its own product of those values as f32 operands (widening while packing is exact). */
static bool same_sums(const shape *s, const sides *d, float *C2) {
  loom__gemm_args g = {.trans_a = s->ta, .trans_b = s->tb, .batch = 1, .M = s->M, .N = s->N,
                       .K = s->K, .alpha = 1.0f, .lda = s->ta ? s->M : s->K,
                       .ldb = s->tb ? s->K : s->N, .ldc = s->N, .A = d->A, .B = d->B,
                       .ab_dtype = LOOM_F32, .c_dtype = LOOM_F32};
  size_t nc = (size_t)(s->M * s->N);
  g.C = d->C;
  BENCH_CHECK(loom__gemm(&g));
  g.C = C2;
  BENCH_CHECK(loom__gemm_avx512(&g));
  loom__gemm_args h = g;
  h.A = d->a, h.B = d->b, h.ab_dtype = d->dt, h.C = d->wa; /* wa: room for any C */
  BENCH_CHECK(loom__gemm_avx512(&h));
  double worst = bench_gemm_rel_diff(d->C, C2, nc, s->K);
  bool same = memcmp(C2, d->wa, nc * sizeof(float)) == 0;
  if (worst <= 1e-5 && same) return true;
  fprintf(stderr, "bench_gemm_avx512: %s: avx512 differs from oneDNN f32 by %.3g relative%s\n",
          s->what, worst, same ? "" : ", and from itself on the f32 values");
  return false;
}

/* Each side's median seconds for shape s, the sides interleaved round by round. */
static void time_shape(const shape *s, const sides *d, int rounds, double m[SIDES]) {
  double t[SIDES][MAXR];
  for (int k = 0; k < rounds; k++)
    for (int side = 0; side < SIDES; side++) t[side][k] = run(side, s, d);
  for (int side = 0; side < SIDES; side++) m[side] = bench_median(t[side], rounds);
}

/* The products of a stack of linear layers io[l] = {in, out} over R rows. */
static int linears(shape *out, int64_t R, const int64_t (*io)[2], const char **names, int n,
                   bool first_gx) {
  int ns = 0;
  for (int l = 0; l < n; l++) {
    int64_t I = io[l][0], O = io[l][1];
    out[ns++] = (shape){names[l], R, O, I, false, true};                    /* y = x W^T + b */
    if (l || first_gx) out[ns++] = (shape){names[l], R, I, O, false, false}; /* gX = G W */
    out[ns++] = (shape){names[l], O, I, R, true, false};                    /* gW = G^T X */
  }
  return ns;
}

int main(int argc, char **argv) {
  int rounds = argc > 1 ? atoi(argv[1]) : 5;
  if (rounds < 1 || rounds > MAXR) rounds = 5;
  loom_dtype dt = argc > 2 && !strcmp(argv[2], "f16") ? LOOM_F16 : LOOM_BF16;
  bool gpt = argc > 3 && !strcmp(argv[3], "gpt");
  if (!loom_cpu_supports(LOOM_CPU_AVX512)) {
    printf("bench_gemm_avx512: this CPU has no AVX-512; nothing to time\n");
    return 0;
  }
  loom_set_num_threads(1);
  const char *isa = getenv("ONEDNN_MAX_CPU_ISA");
  printf("# bench_gemm_avx512: %s, %s products, 1 thread, %d rounds, CPU time; "
         "ONEDNN_MAX_CPU_ISA=%s; loom__gemm takes this GEMM for %s: %s\n",
         loom_dtype_name(dt), gpt ? "GPT" : "MLP", rounds, isa ? isa : "unset",
         loom_dtype_name(dt),
         !loom__gemm_native(dt) && loom__gemm_avx512_wanted(&(loom__gemm_args){.ab_dtype = dt})
             ? "yes"
             : "no");
  shape shapes[MAXS];
  int ns;
  if (gpt) {
    static const int64_t io[][2] = {{384, 1152}, {384, 384}, {384, 1536}, {1536, 384}};
    static const char *names[] = {"c_attn", "attn.c_proj", "mlp.c_fc", "mlp.c_proj"};
    ns = linears(shapes, 4096, io, names, 4, true);
  } else {
    static const int64_t io[][2] = {{784, 1024}, {1024, 1024}, {1024, 10}};
    static const char *names[] = {"fc1", "fc2", "fc3"};
    ns = linears(shapes, 256, io, names, 3, false);
  }
  size_t big = (size_t)4096 * 1536;
  float *A = buf(big * 4), *B = buf(big * 4), *C = buf(big * 4), *C2 = buf(big * 4);
  float *wa = buf(big * 4), *wb = buf(big * 4), *bias = buf(1536 * 4);
  uint16_t *a = buf(big * 2), *b = buf(big * 2), *c = buf(big * 2);
  bench_gemm_operands(A, B, a, b, big, dt); /* the same values on every side */
  for (int i = 0; i < 1536; i++) bias[i] = 0.01f * (float)(i % 7);
  sides d = {dt, A, B, bias, a, b, C, wa, wb, c};
  double sum[SIDES] = {0};
  printf("%-12s %-4s %5s %5s %5s | %9s %9s %9s | %s\n", "layer", "kind", "M", "N", "K",
         "f32 ms", "widened", "avx512", "avx512 GFLOP/s, widened/avx512, f32/avx512");
  for (int i = 0; i < ns; i++) {
    const shape *s = &shapes[i];
    if (!same_sums(s, &d, C2)) return 1;
    double m[SIDES];
    time_shape(s, &d, rounds, m);
    for (int side = 0; side < SIDES; side++) sum[side] += m[side];
    printf("%-12s %-4s %5lld %5lld %5lld | %9.3f %9.3f %9.3f | %.1f, %.2f, %.2f\n", s->what,
           s->tb ? "NT" : s->ta ? "TN" : "NN", (long long)s->M, (long long)s->N, (long long)s->K,
           m[0] * 1e3, m[1] * 1e3, m[2] * 1e3, 2.0 * (double)s->M * s->N * s->K / m[2] * 1e-9,
           m[1] / m[2], m[0] / m[2]);
  }
  printf("%-30s | %9.3f %9.3f %9.3f | -, %.2f, %.2f\n", "the step's products", sum[0] * 1e3,
         sum[1] * 1e3, sum[2] * 1e3, sum[1] / sum[2], sum[0] / sum[2]);
  free(A), free(B), free(C), free(C2), free(wa), free(wb), free(bias), free(a), free(b), free(c);
  return 0;
}
