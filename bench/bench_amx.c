/* bench_amx.c: loom's AMX bf16 GEMM (src/ops/gemm_amx.c) against oneDNN's bf16 matmul, shape
 * by shape, the measurements behind gemm_amx.c's rule (loom__gemm_prefer_amx).
 *
 * Each shape runs through loom__gemm with bf16 A and B and f32 C (the transposes as named: NN,
 * NT = B stored [N,K] as linear's forward, TN = A stored [K,M] as its weight gradient), once
 * with the AMX kernel forced (loom__gemm_amx_set_mode ALWAYS) and once with oneDNN forced
 * (NEVER), alternating call by call and swapping which goes first every call, so both see the
 * same load and each finds the operands as warm as the other did. "cold": before every call a
 * 32 MiB buffer is written, so A, B and C come from memory, as in a training step where other
 * layers ran in between. Times are the calling thread's CPU time (1 thread, pinned), medians
 * over CALLS calls each; ratio = oneDNN's time / AMX's (> 1: AMX faster); "auto" says what the
 * rule picks. The two results are compared first (within bf16 inputs' f32 summation).
 * Usage: bench_amx [CALLS] [PREFIX] (default 21 calls; PREFIX: only the shapes whose name starts
 * with it, e.g. "gpt"). Skips everything where loom has no AMX. */
#define _GNU_SOURCE
#include "bench_util.h"

#include "ops/gemm.h"

#include <loom/loom.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct shape {
  const char *name;
  int64_t M, N, K;
  bool ta, tb;
} shape;

static const shape shapes[] = {
    {"NN", 1024, 1024, 1024, false, false},    {"NT", 1024, 1024, 1024, false, true},
    {"TN", 1024, 1024, 1024, true, false},     {"NN", 4096, 4096, 1024, false, false},
    {"NN", 512, 512, 512, false, false},       {"NN", 256, 256, 256, false, false},
    {"NT", 256, 256, 256, false, true},        {"NN", 128, 128, 128, false, false},
    {"NN", 64, 64, 64, false, false},          {"NT", 64, 1024, 1024, false, true},
    {"NT", 128, 1024, 1024, false, true},      {"NN", 1024, 128, 1024, false, false},
    {"NN", 1024, 1024, 64, false, false},      {"TN", 1024, 1024, 128, true, false},
    /* the MLP 784-1024-1024-10 step at batch 256, as linear runs it */
    {"fwd1-NT", 256, 1024, 784, false, true},  {"fwd2-NT", 256, 1024, 1024, false, true},
    {"fwd3-NT", 256, 10, 1024, false, true},   {"dW3-TN", 10, 1024, 256, true, false},
    {"dX3-NN", 256, 1024, 10, false, false},   {"dW2-TN", 1024, 1024, 256, true, false},
    {"dX2-NN", 256, 1024, 1024, false, false}, {"dW1-TN", 1024, 784, 256, true, false},
    /* the GPT step's (6 layers, 384 wide, context 256, batch 16: 4096 rows), as linear runs it */
    {"gpt-qkv-NT", 4096, 1152, 384, false, true}, {"gpt-prj-NT", 4096, 384, 384, false, true},
    {"gpt-fc-NT", 4096, 1536, 384, false, true},  {"gpt-mlp-NT", 4096, 384, 1536, false, true},
    {"gpt-lm-NT", 4096, 256, 384, false, true},   {"gpt-dX-qkv", 4096, 384, 1152, false, false},
    {"gpt-dX-prj", 4096, 384, 384, false, false}, {"gpt-dX-fc", 4096, 384, 1536, false, false},
    {"gpt-dX-mlp", 4096, 1536, 384, false, false}, {"gpt-dW-qkv", 1152, 384, 4096, true, false},
    {"gpt-dW-prj", 384, 384, 4096, true, false},  {"gpt-dW-fc", 1536, 384, 4096, true, false},
    {"gpt-dW-mlp", 384, 1536, 4096, true, false},
};
#define NSHAPES (int)(sizeof shapes / sizeof *shapes)

static char *flush_buf;
enum { FLUSH_BYTES = 32 << 20 };

static void run(const loom__gemm_args *g, loom__gemm_amx_mode m) {
  loom__gemm_amx_set_mode(m);
  BENCH_CHECK(loom__gemm(g));
}

int main(int argc, char **argv) {
  int calls = argc > 1 ? atoi(argv[1]) : 21;
  if (calls < 3 || calls > 1001) {
    fprintf(stderr, "bench_amx: CALLS: expected an integer from 3 to 1001, got '%s'\n", argv[1]);
    return 2;
  }
  loom_set_num_threads(1);
  int cpu = bench_pin();
  if (!loom__gemm_amx_available()) {
    printf("# bench_amx: skipped: this CPU (or the kernel, or LOOM_CPU) runs no AMX for loom\n");
    return 0;
  }
  flush_buf = malloc(FLUSH_BYTES);
  double *t = malloc(2 * (size_t)calls * sizeof *t);
  if (!flush_buf || !t) return 1;
  printf("# loom's AMX bf16 GEMM against oneDNN (bf16 x bf16 -> f32), 1 thread pinned to CPU %d, "
         "median of %d calls each by thread CPU time, alternating\n",
         cpu, calls);
  int failed = 0;
  for (int i = 0; i < NSHAPES; i++) {
    const shape *s = &shapes[i];
    if (argc > 2 && strncmp(s->name, argv[2], strlen(argv[2]))) continue;
    int64_t ar = s->ta ? s->K : s->M, ac = s->ta ? s->M : s->K;
    int64_t br = s->tb ? s->N : s->K, bc = s->tb ? s->K : s->N;
    loom_tensor *a = bench_rand_tensor(2, (int64_t[]){ar, ac}, LOOM_BF16, 1.0f);
    loom_tensor *b = bench_rand_tensor(2, (int64_t[]){br, bc}, LOOM_BF16, 1.0f);
    loom_tensor *c1, *c2;
    BENCH_CHECK(loom_tensor_empty(LOOM_F32, 2, (int64_t[]){s->M, s->N}, &c1));
    BENCH_CHECK(loom_tensor_empty(LOOM_F32, 2, (int64_t[]){s->M, s->N}, &c2));
    loom__gemm_args g = {.trans_a = s->ta, .trans_b = s->tb, .batch = 1, .M = s->M, .N = s->N,
                         .K = s->K, .alpha = 1.0f, .A = loom_tensor_data(a), .lda = ac,
                         .B = loom_tensor_data(b), .ldb = bc, .C = loom_tensor_data(c1),
                         .ldc = s->N, .ab_dtype = LOOM_BF16, .c_dtype = LOOM_F32};
    loom__gemm_args h = g;
    h.C = loom_tensor_data(c2);
    run(&g, LOOM__GEMM_AMX_ALWAYS);
    run(&h, LOOM__GEMM_AMX_NEVER);
    const float *x = g.C, *y = h.C;
    for (int64_t e = 0; e < s->M * s->N; e++)
      if (fabsf(x[e] - y[e]) > 1e-5f * (float)s->K + 1e-6f) {
        fprintf(stderr, "bench_amx: %s %lldx%lldx%lld C[%lld]: AMX %.9g, oneDNN %.9g\n", s->name,
                (long long)s->M, (long long)s->N, (long long)s->K, (long long)e, x[e], y[e]);
        failed = 1;
        break;
      }
    loom__gemm_amx_set_mode(LOOM__GEMM_AMX_AUTO);
    bool pick = loom__gemm_prefer_amx(&g);
    double flop = 2.0 * (double)s->M * (double)s->N * (double)s->K, m[2][2];
    for (int cold = 0; cold < 2; cold++) {
      for (int r = 0; r < calls; r++)
        for (int k = 0; k < 2; k++) {
          int side = (r + k) % 2; /* 0: AMX, 1: oneDNN; who goes first alternates */
          if (cold) memset(flush_buf, r + k, FLUSH_BYTES); /* (not timed) */
          double c0 = bench_cpu_now();
          run(side ? &h : &g, side ? LOOM__GEMM_AMX_NEVER : LOOM__GEMM_AMX_ALWAYS);
          t[side * calls + r] = bench_cpu_now() - c0;
        }
      m[cold][0] = bench_median(t, calls), m[cold][1] = bench_median(t + calls, calls);
    }
    printf("amx %-10s %5lldx%5lldx%5lld warm: amx %7.1f onednn %7.1f GFLOP/s ratio %.2f | cold: "
           "amx %7.1f onednn %7.1f ratio %.2f | auto %s\n",
           s->name, (long long)s->M, (long long)s->N, (long long)s->K, flop / m[0][0] * 1e-9,
           flop / m[0][1] * 1e-9, m[0][1] / m[0][0], flop / m[1][0] * 1e-9,
           flop / m[1][1] * 1e-9, m[1][1] / m[1][0], pick ? "amx" : "onednn");
    fflush(stdout);
    loom_tensor_free(a), loom_tensor_free(b), loom_tensor_free(c1), loom_tensor_free(c2);
  }
  loom__gemm_amx_set_mode(LOOM__GEMM_AMX_FROM_ENV);
  free(flush_buf);
  free(t);
  return failed;
}
