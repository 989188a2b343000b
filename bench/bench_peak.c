/* bench_peak.c: the arithmetic peak of one core, measured, so that a GEMM's GFLOP/s can be
 * read as a fraction of what the instructions allow (issue 27, item 2), and loom's matmul at
 * 1024^3 in f32 and bf16 against it in the same run.
 *
 * Peaks (1 thread, register-only loops of independent accumulators, no loads):
 *   fma ymm    VFMADD231PS on 8 floats     (AVX2 + FMA)     16 FLOP an instruction
 *   fma zmm    VFMADD231PS on 16 floats    (AVX-512F)       32 FLOP
 *   dpbf16 zmm VDPBF16PS, 16 lanes x 2 bf16 pairs (AVX512-BF16) 64 FLOP
 *   amx bf16   TDPBF16PS, 16x16 f32 tile += 16x32 bf16 by 32x16 bf16, four accumulator tiles
 *              fed by two A and two B tiles (the 2x2 blocking of AMX GEMMs)        16384 FLOP
 *   amx bf16 loading: the same 2x2 step with its two A and two B tiles loaded each step from
 *              16 KiB of random bf16 tiles (L1), as a GEMM's inner loop does: what TDPBF16PS
 *              gives once its operands change every step (on the family 6 model 167 Xeon
 *              about 0.8 of the loop above, which keeps its four input tiles constant)
 * Each function is compiled with its own target attribute, so the program builds with any
 * compiler flags and runs on any x86-64 CPU: a line whose instructions the CPU (or, for AMX, the
 * kernel: arch_prctl ARCH_REQ_XCOMP_PERM) does not grant says "skipped" with the reason.
 *
 * loom's bf16 matmul runs twice: as loom__gemm routes it (loom's AMX GEMM where gemm_amx.c's
 * rule picks it, as at 1024^3) and with oneDNN forced (loom__gemm_amx_set_mode NEVER).
 * Every figure is the median over ROUNDS rounds, the peaks and the matmuls interleaved within
 * each round, timed by the thread's CPU time (CLOCK_THREAD_CPUTIME_ID: time other processes
 * held the core is not counted, so figures taken on a shared machine stay comparable; the wall
 * clock's median is printed beside). The process is pinned to the CPU it starts on.
 * Usage: bench_peak [ROUNDS]  (default 9). */
#define _GNU_SOURCE
#include "bench_util.h"

#include "ops/gemm.h"

#include <loom/loom.h>

#include <cpuid.h>
#include <immintrin.h>
#include <sched.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#define ITERS 2000000L /* loop trips of the vector peaks: 12 (ymm) or 16 instructions each */
#define AMX_ITERS 200000L /* trips of the AMX loop: 4 TDPBF16PS each */

static volatile float sink;

/* NACC independent chains of `OP` on accumulators acc[0..NACC), ITERS trips: no chain waits for
 * another, so the loop is bound by issue rate, not latency (ymm: 12, which with the two operands
 * fits AVX2's 16 registers; zmm: 16 of AVX-512's 32). */
#define PEAK_LOOP(NACC, VT, ZERO, OP, ADD, STORE, WIDTH)                                          \
  VT acc[NACC];                                                                                    \
  for (int k = 0; k < NACC; k++) acc[k] = ZERO;                                                      \
  for (long it = 0; it < ITERS; it++) {                                                            \
    _Pragma("GCC unroll 16") for (int k = 0; k < NACC; k++) acc[k] = OP;                             \
  }                                                                                                \
  VT s = acc[0];                                                                                   \
  for (int k = 1; k < NACC; k++) s = ADD(s, acc[k]);                                                 \
  float out[WIDTH];                                                                                \
  STORE(out, s);                                                                                   \
  sink = out[0];

__attribute__((target("avx2,fma"))) static void fma_ymm(void) {
  const __m256 a = _mm256_set1_ps(1.0001f), b = _mm256_set1_ps(0.9999f);
  PEAK_LOOP(12, __m256, _mm256_setzero_ps(), _mm256_fmadd_ps(a, b, acc[k]), _mm256_add_ps,
            _mm256_storeu_ps, 8)
}

__attribute__((target("avx512f"))) static void fma_zmm(void) {
  const __m512 a = _mm512_set1_ps(1.0001f), b = _mm512_set1_ps(0.9999f);
  PEAK_LOOP(16, __m512, _mm512_setzero_ps(), _mm512_fmadd_ps(a, b, acc[k]), _mm512_add_ps,
            _mm512_storeu_ps, 16)
}

__attribute__((target("avx512f,avx512bf16"))) static void dpbf16_zmm(void) {
  /* bf16 1.0 = 0x3f80 in every half */
  const __m512bh a = (__m512bh)_mm512_set1_epi32(0x3f803f80), b = a;
  PEAK_LOOP(16, __m512, _mm512_setzero_ps(), _mm512_dpbf16_ps(acc[k], a, b), _mm512_add_ps,
            _mm512_storeu_ps, 16)
}

/* ---- AMX ----------------------------------------------------------------------------------- */
#define ARCH_GET_XCOMP_PERM 0x1022
#define ARCH_REQ_XCOMP_PERM 0x1023
#define XFEATURE_XTILEDATA 18

typedef struct __attribute__((packed, aligned(64))) tilecfg {
  uint8_t palette, start_row, reserved[14];
  uint16_t colsb[16];
  uint8_t rows[16];
} tilecfg;

static uint16_t amx_a[2][16 * 32] __attribute__((aligned(64)));
static float amx_c[16 * 16] __attribute__((aligned(64)));

__attribute__((target("amx-tile,amx-bf16"))) static void amx_bf16(void) {
  tilecfg cfg = {.palette = 1};
  for (int t = 0; t < 8; t++) cfg.colsb[t] = 64, cfg.rows[t] = 16;
  _tile_loadconfig(&cfg);
  _tile_zero(0);
  _tile_zero(1);
  _tile_zero(2);
  _tile_zero(3);
  _tile_loadd(4, amx_a[0], 64);
  _tile_loadd(5, amx_a[1], 64);
  _tile_loadd(6, amx_a[1], 64);
  _tile_loadd(7, amx_a[0], 64);
  for (long it = 0; it < AMX_ITERS; it++) {
    _tile_dpbf16ps(0, 4, 6);
    _tile_dpbf16ps(1, 4, 7);
    _tile_dpbf16ps(2, 5, 6);
    _tile_dpbf16ps(3, 5, 7);
  }
  _tile_stored(0, amx_c, 64);
  _tile_release();
  sink = amx_c[0];
}

static uint16_t amx_l1[16][16 * 32] __attribute__((aligned(64))); /* 16 KiB of random tiles */

__attribute__((target("amx-tile,amx-bf16"))) static void amx_bf16_loading(void) {
  tilecfg cfg = {.palette = 1};
  for (int t = 0; t < 8; t++) cfg.colsb[t] = 64, cfg.rows[t] = 16;
  _tile_loadconfig(&cfg);
  _tile_zero(0);
  _tile_zero(1);
  _tile_zero(2);
  _tile_zero(3);
  for (long it = 0; it < AMX_ITERS; it++) {
    const uint16_t *a = amx_l1[(it & 3) * 4], *b = a + 2 * 16 * 32;
    _tile_loadd(4, a, 64);
    _tile_loadd(6, b, 64);
    _tile_loadd(7, b + 16 * 32, 64);
    _tile_dpbf16ps(0, 4, 6);
    _tile_loadd(5, a + 16 * 32, 64);
    _tile_dpbf16ps(1, 4, 7);
    _tile_dpbf16ps(2, 5, 6);
    _tile_dpbf16ps(3, 5, 7);
  }
  _tile_stored(0, amx_c, 64);
  _tile_release();
  sink = amx_c[0];
}

/* "" when the CPU and the OS run AMX-BF16 for this process, else why not. */
static const char *amx_why_not(void) {
  unsigned a, b, c, d;
  if (!__get_cpuid_count(7, 0, &a, &b, &c, &d)) return "no CPUID leaf 7";
  if (!(d & (1u << 24)) || !(d & (1u << 22))) return "CPU has no AMX-TILE / AMX-BF16";
  if (syscall(SYS_arch_prctl, ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA) != 0)
    return "the kernel refused ARCH_REQ_XCOMP_PERM (XTILEDATA)";
  return "";
}

/* ---- the table ----------------------------------------------------------------------------- */
enum { P_YMM, P_ZMM, P_DPBF16, P_AMX, P_AMX_LOAD, P_MM_F32, P_MM_BF16, P_MM_DNNL, NP };
static const char *const pname[NP] = {
    "fma ymm (vfmadd231ps)",  "fma zmm (vfmadd231ps)",   "dpbf16 zmm (vdpbf16ps)",
    "amx bf16 (tdpbf16ps)",   "amx bf16 loading tiles",  "loom matmul f32 1024^3",
    "loom matmul bf16 1024^3", "  same, oneDNN forced"};

typedef struct mm {
  loom_tensor *a, *b;
} mm;

static void run_mm(const mm *m) {
  loom_tensor *c;
  BENCH_CHECK(loom_matmul(m->a, m->b, &c));
  loom_tensor_free(c);
}

int main(int argc, char **argv) {
  int rounds = argc > 1 ? atoi(argv[1]) : 9;
  if (rounds < 1 || rounds > 1000) {
    fprintf(stderr, "bench_peak: ROUNDS: expected an integer from 1 to 1000, got '%s'\n",
            argv[1]);
    return 2;
  }
  loom_set_num_threads(1);
  int cpu = bench_pin();
  __builtin_cpu_init();
  const char *why[NP] = {0};
  bool avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  bool avx512 = __builtin_cpu_supports("avx512f");
  bool bf16 = avx512 && __builtin_cpu_supports("avx512bf16");
  why[P_YMM] = avx2 ? "" : "CPU has no AVX2 + FMA";
  why[P_ZMM] = avx512 ? "" : "CPU has no AVX-512F";
  why[P_DPBF16] = bf16 ? "" : "CPU has no AVX512-BF16";
  why[P_AMX] = why[P_AMX_LOAD] = amx_why_not();
  why[P_MM_F32] = why[P_MM_BF16] = why[P_MM_DNNL] = "";
  for (int i = 0; i < 2 * 16 * 32; i++) (&amx_a[0][0])[i] = 0x3f80;
  uint32_t x = 12345; /* bf16 in [1, 2) with random mantissas, random signs */
  for (int i = 0; i < 16 * 16 * 32; i++, x = x * 1664525u + 1013904223u)
    (&amx_l1[0][0])[i] = (uint16_t)(0x3f80 | (x >> 25) | ((x >> 8) & 0x8000));

  int64_t shape[2] = {1024, 1024};
  mm m32 = {bench_rand_tensor(2, shape, LOOM_F32, 1), bench_rand_tensor(2, shape, LOOM_F32, 1)};
  mm m16 = {bench_rand_tensor(2, shape, LOOM_BF16, 1), bench_rand_tensor(2, shape, LOOM_BF16, 1)};
  run_mm(&m32), run_mm(&m16); /* primitives made, caches warm */
  loom__gemm_amx_set_mode(LOOM__GEMM_AMX_NEVER);
  run_mm(&m16);
  loom__gemm_amx_set_mode(LOOM__GEMM_AMX_FROM_ENV);
  printf("# loom's bf16 1024^3 runs on: %s\n",
         loom__gemm_amx_available() ? "loom's AMX GEMM (gemm_amx.c) where its rule picks it"
                                    : "oneDNN (no AMX for loom here)");

  /* a trip: ymm 12 instructions x 8 lanes x 2; zmm 16 x 16 x 2; dpbf16 16 x 16 x 2 pairs x 2 */
  const double flop[NP] = {192.0 * ITERS, 512.0 * ITERS, 1024.0 * ITERS,
                           4.0 * 16384 * AMX_ITERS, 4.0 * 16384 * AMX_ITERS,
                           2.0 * 1024 * 1024 * 1024, 2.0 * 1024 * 1024 * 1024,
                           2.0 * 1024 * 1024 * 1024};
  static double tc[NP][1000], tw[NP][1000];
  for (int r = 0; r < rounds; r++)
    for (int q = 0; q < NP; q++) {
      /* the two bf16 matmuls swap places every other round: the second finds A and B warm */
      int p = r % 2 && q >= P_MM_BF16 ? P_MM_BF16 + P_MM_DNNL - q : q;
      if (why[p][0]) continue;
      double w0 = bench_now(), c0 = bench_cpu_now();
      switch (p) {
      case P_YMM: fma_ymm(); break;
      case P_ZMM: fma_zmm(); break;
      case P_DPBF16: dpbf16_zmm(); break;
      case P_AMX: amx_bf16(); break;
      case P_AMX_LOAD: amx_bf16_loading(); break;
      case P_MM_F32: run_mm(&m32); break;
      case P_MM_BF16: run_mm(&m16); break;
      default:
        loom__gemm_amx_set_mode(LOOM__GEMM_AMX_NEVER);
        run_mm(&m16);
        loom__gemm_amx_set_mode(LOOM__GEMM_AMX_FROM_ENV);
      }
      tc[p][r] = bench_cpu_now() - c0;
      tw[p][r] = bench_now() - w0;
    }
  double gf[NP] = {0};
  printf("# instruction peaks and loom's matmul, 1 thread (pinned to CPU %d), median of %d "
         "interleaved rounds, GFLOP/s by thread CPU time (wall clock beside)\n", cpu, rounds);
  printf("%-26s %12s %12s\n", "what", "GFLOP/s cpu", "GFLOP/s wall");
  for (int p = 0; p < NP; p++) {
    if (why[p][0]) {
      printf("%-26s skipped: %s\n", pname[p], why[p]);
      continue;
    }
    gf[p] = flop[p] / bench_median(tc[p], rounds) / 1e9;
    printf("%-26s %12.1f %12.1f\n", pname[p], gf[p], flop[p] / bench_median(tw[p], rounds) / 1e9);
  }
  double f32_peak = gf[P_ZMM] > 0 ? gf[P_ZMM] : gf[P_YMM];
  double bf16_peak = gf[P_AMX] > gf[P_DPBF16] ? gf[P_AMX] : gf[P_DPBF16];
  if (f32_peak > 0)
    printf("matmul f32 / f32 FMA peak: %.2f\n", gf[P_MM_F32] / f32_peak);
  if (bf16_peak > 0) {
    printf("matmul bf16 / bf16 peak (%s): %.2f (target >= 0.80); oneDNN forced: %.2f\n",
           gf[P_AMX] > gf[P_DPBF16] ? "amx" : "vdpbf16ps", gf[P_MM_BF16] / bf16_peak,
           gf[P_MM_DNNL] / bf16_peak);
    if (gf[P_AMX_LOAD] > 0)
      printf("matmul bf16 / amx loading-tiles peak: %.2f (that peak / amx peak: %.2f); "
             "loom / oneDNN: %.2f\n",
             gf[P_MM_BF16] / gf[P_AMX_LOAD], gf[P_AMX_LOAD] / gf[P_AMX],
             gf[P_MM_BF16] / gf[P_MM_DNNL]);
    if (gf[P_DPBF16] > 0)
      printf("matmul bf16 / vdpbf16ps peak: %.2f\n", gf[P_MM_BF16] / gf[P_DPBF16]);
    printf("bf16 peak / f32 peak: %.2f\n", bf16_peak / f32_peak);
  }
  loom_tensor_free(m32.a), loom_tensor_free(m32.b), loom_tensor_free(m16.a),
      loom_tensor_free(m16.b);
  return 0;
}
