/* gemm_blas.c: f32 GEMM on OpenBLAS, and the one place that decides when loom__gemm uses it.
 *
 * Why: on a CPU without AVX-512, oneDNN 2.6 runs f32 matmul with its AVX2 "gemm:jit" kernel,
 * and on loom's 64-byte aligned buffers that kernel runs some shapes at half of OpenBLAS's
 * sgemm (256x1024x1024 NN, an MLP layer's input gradient, and 512^3 NN/TN: 0.49-0.64x), a few
 * percent below it on the rest, and above it only when a dimension is tiny (an MLP's 10-wide
 * last layer: 1.1-1.9x). Over the 8 GEMMs of an MLP 784-1024-1024-10 step OpenBLAS takes
 * 16-20% less time (AMD Zen 3, 1 thread; bench_matmul, README "GEMM", BENCHMARKS.md). With
 * AVX-512 oneDNN's brgemm kernels are 1.05-2x OpenBLAS, so there it stays oneDNN.
 *
 * The choice (loom__gemm_prefer_blas), per call, cheap (a few compares after a one-time probe):
 *   - eligible: f32 A, B and C; the calling thread's GEMM thread count is 1 (OpenBLAS's is one
 *     count for the whole process, so only one-thread callers, such as ranks-as-threads, can
 *     have it run on their own thread); every size and leading dimension fits OpenBLAS's int;
 *     OpenBLAS was found at build time; not under ThreadSanitizer (OpenBLAS's own locks are not
 *     visible to it).
 *   - auto (the default): eligible, oneDNN's effective ISA is below avx512_core (so its f32 is
 *     the AVX2 gemm:jit that was measured), OpenBLAS runs AVX2 kernels on this CPU (its core,
 *     openblas_get_corename, is one of loom__blas_core_has_avx2's: Debian's OpenBLAS 0.3.21
 *     falls back to its SSE3 "Prescott" kernels on a CPU it does not know, e.g. an Intel Xeon of
 *     family 6 model 207 (model 167 was seen both ways), 5x slower), and min(M, N, K) > 16.
 *   - LOOM_GEMM_F32=onednn in the environment (read once) never picks OpenBLAS, =openblas picks
 *     it whenever eligible; loom__gemm_blas_set_mode does the same from code (benchmarks).
 *
 * loom__gemm_f32_blas runs the product with cblas_sgemm on the calling thread: batches one by
 * one (stride 0 broadcasts an operand), the bias written into C's rows (or added to them when
 * beta is 1) before a beta = 1 product, so C = alpha A B + bias + beta C in f32 as oneDNN's;
 * the sums are ordered differently, so results differ from oneDNN's in the last bits. On first
 * use it sets OpenBLAS's (process-wide) thread count to 1. */
#include "ops/gemm_int.h"

#include <limits.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <strings.h>

static _Atomic int mode_set = -1; /* loom__gemm_blas_mode; -1: from the environment (read once) */

void loom__gemm_blas_set_mode(loom__gemm_blas_mode m) { atomic_store(&mode_set, (int)m); }

static loom__gemm_blas_mode env_mode(void) {
  const char *e = getenv("LOOM_GEMM_F32");
  if (e && !strcmp(e, "onednn")) return LOOM__GEMM_BLAS_NEVER;
  if (e && !strcmp(e, "openblas")) return LOOM__GEMM_BLAS_ALWAYS;
  return LOOM__GEMM_BLAS_AUTO;
}

static loom__gemm_blas_mode mode(void) {
  int m = atomic_load(&mode_set);
  if (m < 0) { /* two threads may both read the environment: same answer */
    int unset = -1;
    m = (int)env_mode();
    if (!atomic_compare_exchange_strong(&mode_set, &unset, m)) m = unset;
  }
  return (loom__gemm_blas_mode)m;
}

bool loom__blas_core_has_avx2(const char *core) {
  /* the cores OpenBLAS 0.3.21's dynamic dispatch gives AVX2 and AVX-512 CPUs it knows */
  static const char *const fast[] = {"haswell", "zen", "skylakex", "cooperlake",
                                     "sapphirerapids"};
  for (size_t i = 0; core && i < sizeof fast / sizeof *fast; i++)
    if (!strcasecmp(core, fast[i])) return true;
  return false;
}

#ifdef LOOM_HAVE_OPENBLAS
char *openblas_get_corename(void); /* OpenBLAS's own (not in every cblas.h) */
const char *loom__blas_core(void) { return openblas_get_corename(); }
#else
const char *loom__blas_core(void) { return NULL; }
#endif

/* oneDNN's f32 kernels are AVX-512 brgemm (faster than OpenBLAS) when its effective ISA, which
 * honours ONEDNN_MAX_CPU_ISA and loom's LOOM_CPU cap (set up with the engine), includes
 * avx512_core. */
static pthread_once_t isa_once = PTHREAD_ONCE_INIT;
static bool onednn_avx512;

static bool blas_avx2; /* OpenBLAS's core runs AVX2 kernels */

static void isa_probe(void) {
  blas_avx2 = loom__blas_core_has_avx2(loom__blas_core());
  dnnl_engine_t eng;
  (void)loom__dnnl_engine("loom__gemm_prefer_blas", &eng); /* applies loom's ISA cap first */
  dnnl_cpu_isa_t isa = dnnl_get_effective_cpu_isa();
  onednn_avx512 = ((unsigned)isa & (unsigned)dnnl_cpu_isa_avx512_core) ==
                  (unsigned)dnnl_cpu_isa_avx512_core;
}

static bool fits_int(const loom__gemm_args *g) {
  const int64_t v[] = {g->M, g->N, g->K, g->lda, g->ldb, g->ldc};
  for (size_t i = 0; i < sizeof v / sizeof *v; i++)
    if (v[i] > INT_MAX) return false;
  return true;
}

#ifdef LOOM_HAVE_OPENBLAS
#include <cblas.h>
void openblas_set_num_threads(int num_threads); /* OpenBLAS's own (not in every cblas.h) */
enum { HAVE_BLAS = 1 };
#else
enum { HAVE_BLAS = 0 };
#endif

#ifdef __SANITIZE_THREAD__
enum { TSAN = 1 };
#else
enum { TSAN = 0 };
#endif

bool loom__gemm_prefer_blas(const loom__gemm_args *g) {
  loom__gemm_blas_mode m = mode();
  if (m == LOOM__GEMM_BLAS_NEVER || !HAVE_BLAS || TSAN) return false;
  if (g->ab_dtype != LOOM_F32 || g->c_dtype != LOOM_F32 || !fits_int(g)) return false;
  if (loom__gemm_threads() != 1) return false;
  if (m == LOOM__GEMM_BLAS_ALWAYS) return true;
  pthread_once(&isa_once, isa_probe);
  int64_t least = g->M < g->N ? g->M : g->N;
  if (g->K < least) least = g->K;
  return !onednn_avx512 && blas_avx2 && least > 16;
}

#ifdef LOOM_HAVE_OPENBLAS
static pthread_once_t blas_once = PTHREAD_ONCE_INIT;

static void blas_init(void) { openblas_set_num_threads(1); }

int loom__gemm_f32_blas(const loom__gemm_args *g) {
  static const char who[] = "loom__gemm_f32_blas";
  int rc = loom__gemm_check(g, who);
  if (rc != LOOM_OK) return rc;
  if (g->ab_dtype != LOOM_F32 || g->c_dtype != LOOM_F32)
    return loom__fail(LOOM_EDTYPE, "%s: OpenBLAS path takes f32 A, B and C, got %s x %s -> %s",
                      who, loom_dtype_name(g->ab_dtype), loom_dtype_name(g->ab_dtype),
                      loom_dtype_name(g->c_dtype));
  if (!fits_int(g))
    return loom__fail(LOOM_EOVERFLOW, "%s: a size or leading dimension exceeds OpenBLAS's int",
                      who);
  if (loom__dry()) return LOOM_OK;
  pthread_once(&blas_once, blas_init);
  const float *A = g->A, *B = g->B;
  float *C = g->C;
  float beta = g->beta;
  for (int64_t p = 0; p < g->batch; p++) {
    const float *a = A + p * g->stride_a, *b = B + p * g->stride_b;
    float *c = C + p * g->stride_c;
    if (g->bias) { /* C = bias (+ C), then C += A B */
      for (int64_t i = 0; i < g->M; i++) {
        float *row = c + i * g->ldc;
        if (beta == 0.0f) {
          memcpy(row, g->bias, (size_t)g->N * sizeof *row);
        } else {
          for (int64_t j = 0; j < g->N; j++) row[j] += g->bias[j];
        }
      }
    }
    cblas_sgemm(CblasRowMajor, g->trans_a ? CblasTrans : CblasNoTrans,
                g->trans_b ? CblasTrans : CblasNoTrans, (int)g->M, (int)g->N, (int)g->K, g->alpha,
                a, (int)g->lda, b, (int)g->ldb, g->bias ? 1.0f : beta, c, (int)g->ldc);
  }
  return LOOM_OK;
}
#else
int loom__gemm_f32_blas(const loom__gemm_args *g) {
  int rc = loom__gemm_check(g, "loom__gemm_f32_blas");
  if (rc != LOOM_OK) return rc;
  return loom__fail(LOOM_ENOSYS, "loom__gemm_f32_blas: loom was built without OpenBLAS");
}
#endif
