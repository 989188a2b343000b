/* gemm.h: the matrix-multiply and convolution kernels of the ops layer (private to loom).
 * Raw kernels over contiguous row-major buffers, no autograd: the ops in src/ops/ build their
 * forward and backward from these. Implemented with oneDNN (see README, "GEMM"), with a
 * scalar reference beside each for the tests. All return a loom status with a message.
 *
 * Dtypes: A and B are f32, bf16 or f16, both the same dtype. C is f32 or the inputs' dtype;
 * accumulation is always f32. f16 operands, and bf16 ones on CPUs where oneDNN has no bf16
 * kernel (no AVX-512), are widened to f32 copies (exact) and multiplied in f32; a 16-bit C is
 * then rounded once. Either way the result is the f32 product of the operands' values.
 *
 * Errors (kernels and references alike, message naming the function and the argument):
 * LOOM_EINVAL for a NULL pointer, a size that is not positive, beta not 0/1 or a bias with
 * alpha not 1; LOOM_EDTYPE for
 * a dtype not listed above; LOOM_ESHAPE for a leading dimension shorter than a row or batches
 * of C that overlap; LOOM_ENOMEM when a work buffer cannot be allocated; LOOM_EBACKEND with
 * oneDNN's status text when oneDNN fails. Outputs are unspecified after an error.
 *
 * Memory: outputs must not overlap inputs. Work buffers (oneDNN's scratchpad, f32 copies of f16
 * operands) come from the compute pool and are freed before the call returns.
 *
 * Threads: every function may be called from any number of threads at once. oneDNN runs each
 * call on the calling thread's OpenMP team (loom__gemm_set_threads). Built oneDNN primitives
 * are cached process-wide by shape, strides, dtypes, alpha, beta and thread count (the first
 * call of a shape costs 0.1-40 ms, later ones microseconds of overhead). */
#ifndef LOOM_OPS_GEMM_H
#define LOOM_OPS_GEMM_H

#include "core/core_int.h"

#include <stdbool.h>
#include <stdint.h>

/* C[M,N] = alpha * op(A) op(B) + bias + beta * C, where op(A) is A[M,K] (lda = row stride)
 * or, with trans_a, A stored as [K,M]; likewise B[K,N] or B stored [N,K] with trans_b. beta is
 * 0 or 1 (accumulate into C). bias: NULL, or N f32 values added to every row in f32 before C
 * is rounded to its dtype (alpha must then be 1). batch > 1: `batch` independent products,
 * A/B/C advanced by stride_a/stride_b/stride_c elements (stride 0 broadcasts that operand). */
typedef struct loom__gemm_args {
  bool trans_a, trans_b;
  int64_t batch, M, N, K;
  float alpha, beta;
  const void *A;
  int64_t lda, stride_a;
  const void *B;
  int64_t ldb, stride_b;
  void *C;
  int64_t ldc, stride_c;
  loom_dtype ab_dtype, c_dtype;
  const float *bias;
} loom__gemm_args;

int loom__gemm(const loom__gemm_args *g);
/* True if loom__gemm runs `ab_dtype` operands natively in oneDNN on this CPU (f32 always,
 * bf16 where oneDNN has a kernel for it, f16 never); otherwise they are widened to f32. The
 * answer is asked of oneDNN once per process. */
bool loom__gemm_native(loom_dtype ab_dtype);
/* The scalar reference of loom__gemm (tests; f32 accumulation in the same order as written). */
int loom__gemm_ref(const loom__gemm_args *g);

/* f32 GEMM on OpenBLAS (gemm_blas.c), for CPUs where it beats oneDNN's f32 (no AVX-512; README
 * "GEMM"). loom__gemm_f32_blas: the same contract as loom__gemm for f32 A, B and C (LOOM_EDTYPE
 * otherwise), run by cblas_sgemm on the calling thread (it sets OpenBLAS's process-wide thread
 * count to 1 on first use); LOOM_ENOSYS when loom was built without OpenBLAS, LOOM_EOVERFLOW
 * when a size does not fit OpenBLAS's int. loom__gemm_prefer_blas: whether loom__gemm should
 * run g there instead of on oneDNN; the whole choice is in gemm_blas.c's header comment
 * (f32, a calling thread with 1 GEMM thread, oneDNN below AVX-512, OpenBLAS on AVX2 kernels,
 * no dimension <= 16; LOOM_GEMM_F32=onednn|openblas overrides it). Both may be called from any
 * thread. loom__blas_core_has_avx2: whether an OpenBLAS core name (openblas_get_corename, any
 * case) is one that runs AVX2 or AVX-512 kernels; false for NULL and for the fallback cores
 * (Prescott, Core2, Nehalem, Sandybridge, ...) OpenBLAS picks on a CPU it does not know.
 * loom__blas_core: OpenBLAS's core on this CPU (its static string), NULL without OpenBLAS. */
int loom__gemm_f32_blas(const loom__gemm_args *g);
bool loom__gemm_prefer_blas(const loom__gemm_args *g);
bool loom__blas_core_has_avx2(const char *core);
const char *loom__blas_core(void);
typedef enum loom__gemm_blas_mode {
  LOOM__GEMM_BLAS_FROM_ENV = -1, /* as LOOM_GEMM_F32 says (the default: AUTO when unset) */
  LOOM__GEMM_BLAS_AUTO,  /* the measured rule */
  LOOM__GEMM_BLAS_NEVER, /* always oneDNN (LOOM_GEMM_F32=onednn) */
  LOOM__GEMM_BLAS_ALWAYS /* OpenBLAS whenever eligible (LOOM_GEMM_F32=openblas) */
} loom__gemm_blas_mode;
/* Overrides the environment's choice for the whole process (benchmarks compare the two). */
void loom__gemm_blas_set_mode(loom__gemm_blas_mode m);

/* bf16 GEMM on Intel AMX tiles (gemm_amx.c), for CPUs where it beats oneDNN's bf16 (README
 * "GEMM"; the blocking and the whole choice in gemm_amx.c's header comment).
 * loom__gemm_bf16_amx: the same contract as loom__gemm for bf16 A and B with an f32 or bf16 C
 * (LOOM_EDTYPE otherwise), run on the calling thread's GEMM threads; LOOM_ENOSYS where
 * loom__gemm_amx_available is false. loom__gemm_amx_available: the active CPU level is avx512,
 * the CPU has AMX-BF16 and the kernel granted the tile state (asked once per process).
 * loom__gemm_prefer_amx: whether loom__gemm should run g there instead of on oneDNN
 * (LOOM_GEMM_BF16=onednn|amx overrides the size rule; loom__gemm_amx_set_mode from code).
 * All may be called from any thread. */
int loom__gemm_bf16_amx(const loom__gemm_args *g);
/* The kernel itself (gemm_amx.c, built for AVX-512 and AMX), for loom__gemm_bf16_amx alone,
 * once g is checked and loom__gemm_amx_available has said yes (gemm_amx_choice.c). */
int loom__gemm_bf16_amx_run(const loom__gemm_args *g);
bool loom__gemm_amx_available(void);
bool loom__gemm_prefer_amx(const loom__gemm_args *g);
typedef enum loom__gemm_amx_mode {
  LOOM__GEMM_AMX_FROM_ENV = -1, /* as LOOM_GEMM_BF16 says (the default: AUTO when unset) */
  LOOM__GEMM_AMX_AUTO,          /* the measured rule */
  LOOM__GEMM_AMX_NEVER,         /* always oneDNN (LOOM_GEMM_BF16=onednn) */
  LOOM__GEMM_AMX_ALWAYS         /* AMX whenever available (LOOM_GEMM_BF16=amx) */
} loom__gemm_amx_mode;
void loom__gemm_amx_set_mode(loom__gemm_amx_mode m);

/* 2-D convolution, NCHW input [N,C,H,W], weight [O,C,KH,KW], optional bias [O], output
 * [N,O,OH,OW] with OH = (H + 2*pad_h - KH) / stride_h + 1 (likewise OW). */
typedef struct loom__conv2d_args {
  int64_t N, C, H, W, O, KH, KW, stride_h, stride_w, pad_h, pad_w;
  loom_dtype dtype; /* of x, w, b and y (f32, bf16 or f16; see loom__conv2d_native) */
} loom__conv2d_args;

/* True if the convolutions run `dtype` natively in oneDNN on this CPU (f32 always, bf16 where
 * oneDNN has kernels for it, f16 never); otherwise every pass widens its operands to f32
 * (exact), runs in f32 and rounds its outputs once. Asked of oneDNN once per process. */
bool loom__conv2d_native(loom_dtype dtype);

int loom__conv2d_fwd(const loom__conv2d_args *a, const void *x, const void *w, const void *b,
                     void *y);
/* dx = conv2d backward-data(dy, w); dx is overwritten. */
int loom__conv2d_bwd_data(const loom__conv2d_args *a, const void *dy, const void *w, void *dx);
/* dw (and db if not NULL) = backward-weights(x, dy); overwritten (the caller accumulates). */
int loom__conv2d_bwd_weights(const loom__conv2d_args *a, const void *x, const void *dy, void *dw,
                             void *db);
/* Scalar references of the three. */
int loom__conv2d_fwd_ref(const loom__conv2d_args *a, const void *x, const void *w, const void *b,
                         void *y);
int loom__conv2d_bwd_data_ref(const loom__conv2d_args *a, const void *dy, const void *w, void *dx);
int loom__conv2d_bwd_weights_ref(const loom__conv2d_args *a, const void *x, const void *dy,
                                 void *dw, void *db);

/* Threads the GEMM library may use on the calling thread (1 per rank when ranks are threads;
 * n < 1 counts as 1). Without a call, OpenMP's default (OMP_NUM_THREADS, else every core).
 * Under ThreadSanitizer the count is always 1 (OpenMP's runtime is not instrumented). */
void loom__gemm_set_threads(int n);
/* The number of threads oneDNN would use on the calling thread (OpenMP's max threads); fused
 * attention runs its OpenMP team with as many. */
int loom__gemm_threads(void);

#endif
