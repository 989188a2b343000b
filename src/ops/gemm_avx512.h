/* gemm_avx512.h: loom's own AVX-512 GEMM for bf16 / f16 operands (gemm_avx512.c) and the rule
 * that sends loom__gemm there (gemm_avx2_pick.c, with the AVX2 rule). Private to the ops layer.
 *
 * loom__gemm_avx512: loom__gemm's contract (gemm.h: operands f32, bf16 or f16, C f32 or the
 * operands' dtype, f32 sums, the same errors, batches, alpha, beta, bias), computed by packing
 * the operands, widened to f32 as they are packed, into a 12 x 32 FMA micro-kernel on zmm
 * registers; a 16-bit C is rounded in the kernel's epilogue. No f32 copy of an operand is made.
 * Runs on the calling thread's OpenMP team (loom__gemm_threads). Needs AVX512F, AVX512BW and
 * AVX512VL: call it only where loom__gemm_avx512_wanted (or the test's own check of the CPU)
 * says so. Errors: as loom__gemm (LOOM_EINVAL, LOOM_EDTYPE, LOOM_ESHAPE from loom__gemm_check;
 * LOOM_ENOMEM for its packing buffers, from the compute pool, freed before it returns).
 *
 * loom__gemm_avx512_wanted: whether loom__gemm should run g here instead of widening its
 * operands to f32 copies for oneDNN's f32 kernels: 16-bit operands without a fast native oneDNN
 * kernel (the caller has checked loom__gemm_native: f16 always, bf16 on an Intel CPU without
 * AMX or under ONEDNN_MAX_CPU_ISA below AMX), loom's active level avx512, and oneDNN's
 * effective ISA avx512_core or above (below it gemm_avx2.h's rule applies). LOOM_GEMM_AVX512=off
 * in the environment (read once) never picks it (benchmarks compare). */
#ifndef LOOM_OPS_GEMM_AVX512_H
#define LOOM_OPS_GEMM_AVX512_H

#include "ops/gemm.h"

int loom__gemm_avx512(const loom__gemm_args *g);
bool loom__gemm_avx512_wanted(const loom__gemm_args *g);

#endif
