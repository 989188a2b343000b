/* bench_convert.c: GB/s of the four f32 <-> f16/bf16 conversions on 64M elements, 1 thread,
 * beside memcpy of the conversion's source buffer in the same run. GB/s counts bytes read plus
 * bytes written, for both, so the ratio compares memory throughput. Each figure is the median
 * of 9 interleaved runs, timed by the thread's CPU time (time other processes held the core on
 * a shared machine is not counted); buffers are touched first so page faults are not timed.
 * Every level side by side: bench_kernels.
 * Usage: bench_convert [ELEMENTS]  (or `loom bench convert [ELEMENTS]`). */
#include "bench_args.h"
#include "bench_util.h"

#include <loom/loom.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define RUNS 9

typedef struct conv {
  const char *name;
  size_t src_size, dst_size;
  void (*fn)(const void *src, void *dst, size_t n);
} conv;

static void f32_bf16(const void *s, void *d, size_t n) { loom_cvt_f32_to_bf16(s, d, n); }
static void bf16_f32(const void *s, void *d, size_t n) { loom_cvt_bf16_to_f32(s, d, n); }
static void f32_f16(const void *s, void *d, size_t n) { loom_cvt_f32_to_f16(s, d, n); }
static void f16_f32(const void *s, void *d, size_t n) { loom_cvt_f16_to_f32(s, d, n); }

int bench_convert_main(int argc, char **argv) {
  static const bench_arg args[] = {
      {"ELEMENTS", "elements per conversion (default 67108864)", NULL, 1, 1LL << 30}, {0}};
  int done = bench_args(BENCH_PROG("convert"), "GB/s of the f32 <-> f16/bf16 conversions beside "
                        "memcpy, 1 thread, median of 9 runs.", args, argc, argv);
  if (done >= 0) return done;
  size_t n = argc > 1 ? (size_t)strtoull(argv[1], NULL, 10) : ((size_t)64 << 20);
  conv convs[] = {{"f32_to_bf16", 4, 2, f32_bf16},
                  {"bf16_to_f32", 2, 4, bf16_f32},
                  {"f32_to_f16", 4, 2, f32_f16},
                  {"f16_to_f32", 2, 4, f16_f32}};
  unsigned char *src = malloc(n * 4), *dst = malloc(n * 4), *cpy = malloc(n * 4);
  if (!src || !dst || !cpy) {
    fprintf(stderr, "bench_convert: out of memory for %zu elements\n", n);
    return 1;
  }
  float *f = (float *)src;
  for (size_t i = 0; i < n; i++) f[i] = (float)(i % 1000) * 0.001f - 0.5f;
  memset(dst, 0, n * 4);
  memset(cpy, 0, n * 4);
  printf("# conversions, %zu elements, 1 thread, CPU level %s, median of %d runs\n", n,
         loom_cpu_level_name(loom_cpu_level_active()), RUNS);
  printf("%-12s %10s %10s %12s %12s %7s\n", "conversion", "cvt ms", "memcpy ms", "cvt GB/s",
         "memcpy GB/s", "ratio");
  int worst_ok = 1;
  for (size_t c = 0; c < sizeof convs / sizeof convs[0]; c++) {
    double tc[RUNS], tm[RUNS];
    size_t sb = n * convs[c].src_size, db = n * convs[c].dst_size;
    if (convs[c].src_size == 2) loom_cvt_f32_to_bf16(f, (uint16_t *)cpy, n); /* valid halves */
    const unsigned char *in = convs[c].src_size == 2 ? cpy : src;
    for (int r = 0; r < RUNS; r++) {
      double t0 = bench_cpu_now();
      memcpy(dst, in, sb);
      double t1 = bench_cpu_now();
      convs[c].fn(in, dst, n);
      double t2 = bench_cpu_now();
      tm[r] = t1 - t0;
      tc[r] = t2 - t1;
    }
    double mc = bench_median(tc, RUNS), mm = bench_median(tm, RUNS);
    double gc = (double)(sb + db) / mc / 1e9, gm = (double)(2 * sb) / mm / 1e9;
    printf("%-12s %10.2f %10.2f %12.2f %12.2f %7.2f\n", convs[c].name, mc * 1e3, mm * 1e3, gc, gm,
           gc / gm);
    if (gc / gm < (convs[c].src_size == 4 ? 0.9 : 1.0)) worst_ok = 0;
  }
  printf("target (narrowing >= 0.90x memcpy, widening >= 1.00x): %s\n",
         worst_ok ? "met" : "NOT met");
  free(src);
  free(dst);
  free(cpy);
  return 0;
}

#ifndef LOOM_TOOL
int main(int argc, char **argv) { return bench_convert_main(argc, argv); }
#endif
