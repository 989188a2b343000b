/* gemm_avx2.h: loom's own AVX2 GEMM for bf16 / f16 operands (gemm_avx2.c) and the rule that
 * sends loom__gemm there (gemm_avx2_pick.c). Private to the ops layer.
 *
 * loom__gemm_avx2: loom__gemm's contract (gemm.h: operands f32, bf16 or f16, C f32 or the
 * operands' dtype, f32 sums, the same errors, batches, alpha, beta, bias), computed by packing
 * the operands, widened to f32 as they are packed, into a 6 x 16 FMA micro-kernel; a 16-bit C
 * is rounded in the kernel's epilogue. No f32 copy of an operand is made. Runs on the calling
 * thread's OpenMP team (loom__gemm_threads). Needs AVX2, FMA and F16C: call it only where
 * loom__gemm_avx2_wanted (or the test's own check of the CPU) says so. Errors: as loom__gemm
 * (LOOM_EINVAL, LOOM_EDTYPE, LOOM_ESHAPE from loom__gemm_check; LOOM_ENOMEM for its packing
 * buffers, from the compute pool, freed before it returns).
 *
 * loom__gemm_avx2_wanted: whether loom__gemm should run g here instead of widening its
 * operands to f32 copies: 16-bit operands without a native oneDNN kernel (the caller has
 * checked loom__gemm_native), loom's active level AVX2 or above, and oneDNN's effective ISA
 * below avx512_core (with AVX-512 oneDNN's f32 kernels on the widened copies are faster).
 * LOOM_GEMM_AVX2=off in the environment (read once) never picks it (benchmarks compare). */
#ifndef LOOM_OPS_GEMM_AVX2_H
#define LOOM_OPS_GEMM_AVX2_H

#include "ops/gemm.h"

int loom__gemm_avx2(const loom__gemm_args *g);
bool loom__gemm_avx2_wanted(const loom__gemm_args *g);

#endif
