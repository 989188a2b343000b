/* bench_kernels.c: GB/s of the dispatch-level kernels that no other benchmark times alone, on
 * every CPU level this machine runs, beside memcpy in the same run: absmax (the gradient-bound
 * reads, f32 / f16 / bf16), the dist layer's f32 sum (a += b, block by block, as the all-reduce
 * folds a peer's chunk) and its two-source sum written to two destinations (the threads
 * backend's large all-reduce; the fused kernel where the level has one), and the optimizer's
 * SGD (momentum) and Adam steps. 1 thread, buffers of N elements (default 16M: out of cache),
 * each figure the median of 9 runs with the levels and memcpy interleaved. GB/s counts bytes
 * read plus bytes written, for the kernel and for memcpy (of N f32), so ratio = kernel GB/s /
 * memcpy GB/s compares memory throughput (as bench_convert).
 * Usage: bench_kernels [ELEMENTS]. It calls private kernel tables (src/), so it stays out of
 * the `loom bench` tool, which takes only benchmarks of the public API. */
#include "bench_util.h"

#include "dist/reduce_int.h"
#include "ops/ops_int.h"
#include "optim/optim_int.h"

#include <loom/loom.h>

#define RUNS 9

enum { K_ABS_F32, K_ABS_F16, K_ABS_BF16, K_SUM, K_SUM2, K_SGD, K_ADAM, NK };
static const char *const kname[NK] = {"absmax f32",     "absmax f16",     "absmax bf16",
                                      "sum a += b",     "sum2 -> 2 dsts", "sgd momentum",
                                      "adam"};
/* f32-sized streams each kernel reads plus writes, per element (16-bit: half of one). */
static const double kstreams[NK] = {1, 0.5, 0.5, 3, 4, 5, 7};

typedef struct bufs {
  float *a, *b, *y, *z, *m, *v;
  uint16_t *h, *bh;
  size_t n;
} bufs;

static double sink; /* absmax's answers, so the calls are not dropped */

/* One run of kernel k at the active level (absmax at `level`). */
static void run_kernel(int k, loom_cpu_level level, bufs *B) {
  size_t n = B->n;
  switch (k) {
  case K_ABS_F32: sink += loom__absmax_level(B->a, LOOM_F32, n, level); break;
  case K_ABS_F16: sink += loom__absmax_level(B->h, LOOM_F16, n, level); break;
  case K_ABS_BF16: sink += loom__absmax_level(B->bh, LOOM_BF16, n, level); break;
  case K_SUM: {
    loom__combine_fn f = loom__reduce_kernels_for(level)->combine[0][LOOM_SUM];
    for (size_t off = 0; off < n; off += LOOM__REDUCE_BLK)
      f(B->y + off, B->b + off, n - off < LOOM__REDUCE_BLK ? n - off : LOOM__REDUCE_BLK);
    break;
  }
  case K_SUM2: {
    const void *srcs[2] = {B->a, B->b};
    void *dsts[2] = {B->y, B->z};
    loom__reduce_to_all(dsts, 2, srcs, 2, n, LOOM_F32, LOOM_SUM);
    break;
  }
  case K_SGD: {
    loom__sgd_args s = {.wd = 0, .momentum = 0.9f, .omd = 1, .neg_lr = -1e-3f, .grad_scale = 1,
                        .has_momentum = true};
    loom__optim_k_level(level)->sgd(&s, B->y, B->b, B->m, n);
    break;
  }
  default: {
    loom__adam_args a = {.beta1 = 0.9f, .omb1 = 0.1f, .beta2 = 0.999f, .omb2 = 0.001f,
                         .decay = 1, .bc2_sqrt = 0.5f, .eps = 1e-8f, .neg_step = -1e-3f,
                         .grad_scale = 1};
    loom__optim_k_level(level)->adam(&a, B->z, B->b, B->m, B->v, n);
  }
  }
}

int main(int argc, char **argv) {
  size_t n = argc > 1 ? (size_t)strtoull(argv[1], NULL, 10) : ((size_t)16 << 20);
  bufs B = {malloc(n * 4), malloc(n * 4), malloc(n * 4), malloc(n * 4), malloc(n * 4),
            malloc(n * 4), malloc(n * 2), malloc(n * 2), n};
  float *cpy = malloc(n * 4);
  if (!B.a || !B.b || !B.y || !B.z || !B.m || !B.v || !B.h || !B.bh || !cpy) {
    fprintf(stderr, "bench_kernels: out of memory for %zu elements\n", n);
    return 1;
  }
  for (size_t i = 0; i < n; i++) {
    B.a[i] = (float)(i % 1000) * 0.001f - 0.5f;
    B.b[i] = (float)(i % 777) * 0.002f - 0.7f;
    B.y[i] = B.z[i] = B.m[i] = 0.01f;
    B.v[i] = 1e-4f;
  }
  loom_cvt_f32_to_f16(B.a, B.h, n);
  loom_cvt_f32_to_bf16(B.a, B.bh, n);
  memset(cpy, 0, n * 4);
  loom_cpu_level keep = loom_cpu_level_active(), levels[LOOM_CPU_LEVEL_COUNT];
  int nl = 0;
  for (int l = 0; l <= (int)keep; l++)
    if (loom_cpu_supports((loom_cpu_level)l)) levels[nl++] = (loom_cpu_level)l;
  static double t[LOOM_CPU_LEVEL_COUNT][NK][RUNS], tm[RUNS];
  for (int r = 0; r < RUNS; r++) {
    double t0 = bench_now();
    memcpy(cpy, B.a, n * 4);
    tm[r] = bench_now() - t0;
    for (int k = 0; k < NK; k++)
      for (int l = 0; l < nl; l++) {
        BENCH_CHECK(loom_set_cpu_level(levels[l])); /* the levels the table-driven paths take */
        t0 = bench_now();
        run_kernel(k, levels[l], &B);
        t[l][k][r] = bench_now() - t0;
      }
  }
  BENCH_CHECK(loom_set_cpu_level(keep));
  double gm = 2.0 * (double)n * 4 / bench_median(tm, RUNS) / 1e9;
  printf("# dispatch-level kernels, %zu elements, 1 thread, median of %d runs; memcpy of %zu MB: "
         "%.2f GB/s\n", n, RUNS, n * 4 >> 20, gm);
  printf("%-16s %-7s %9s %9s %7s\n", "kernel", "level", "ms", "GB/s", "ratio");
  for (int k = 0; k < NK; k++)
    for (int l = 0; l < nl; l++) {
      double mk = bench_median(t[l][k], RUNS), g = kstreams[k] * (double)n * 4 / mk / 1e9;
      printf("%-16s %-7s %9.2f %9.2f %7.2f\n", kname[k], loom_cpu_level_name(levels[l]), mk * 1e3,
             g, g / gm);
    }
  free(B.a), free(B.b), free(B.y), free(B.z), free(B.m), free(B.v), free(B.h), free(B.bh);
  free(cpy);
  return sink < 0; /* never: magnitudes */
}
