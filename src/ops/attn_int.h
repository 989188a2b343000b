/* attn_int.h: the inner loops of fused attention (attn_fused.c), one table per CPU level
 * (attn_scalar.c, the reference, never vectorized; attn_avx2.c; attn_avx512.c), picked as
 * core_int.h's kernel-table pattern says; tests compare every level with scalar. Rows are D
 * floats, row j of a block at x + j * ld. A block of scores is an accum over k transposed. */
#ifndef LOOM_OPS_ATTN_INT_H
#define LOOM_OPS_ATTN_INT_H

#include "core/core_int.h"
#include "loom/cpu.h"

#include <math.h>
#include <stddef.h>
#include <stdint.h>

typedef struct loom__attn_kernels {
  /* o0 += sum_j p0[j] * v_j and o1 += sum_j p1[j] * v_j for j < n: two output rows from one
   * pass over the block's rows (each v load feeds two FMAs) */
  void (*accum2)(float *o0, float *o1, const float *p0, const float *p1, const float *v,
                 size_t ld, size_t n, size_t D);
  /* o[r] += sum_j p[r][j * ps] * v_j for r < 4, j < n: a tile of four output rows held in
   * registers (on AVX-512 four rows by four vectors) while the block's rows stream by once;
   * the weights ps apart (1: a row; a row length: a column of a row-major block) */
  void (*accum4)(float *const o[4], const float *const p[4], size_t ps, const float *v,
                 size_t ld, size_t n, size_t D);
  /* dst[c * ldd + r] = scale * src[r * lds + c] for r < R, c < C: k or v transposed (and
   * scaled) for the score blocks; SIMD levels move 8 x 8 blocks through registers */
  void (*transpose)(float *dst, size_t ldd, const float *src, size_t lds, size_t R, size_t C,
                    float scale);
  /* x . y over D floats */
  float (*dot)(const float *x, const float *y, size_t D);
  /* o += sum_j p[j] * v_j for j < n: a block of weighted value rows into one output row */
  void (*accum)(float *o, const float *p, const float *v, size_t ld, size_t n, size_t D);
  /* p[j] = exp(s[j] - m) for j < n (p may be s); returns their sum. SIMD levels use a
   * polynomial exp within 2 ulp of expf's (values below exp(-87) may come out as 0). */
  float (*expsum)(float *p, const float *s, size_t n, float m);
  /* the largest of m and s[0..n) (NaNs in s are passed over) */
  float (*max)(const float *s, size_t n, float m);
} loom__attn_kernels;

/* AMX (attn_amx.c): fused attention's products on bf16 tiles with f32 sums, for bf16 q, k, v
 * where loom__attn_amx_fits(D) (loom__cpu_amx_bf16() and D a multiple of 32, at most 256).
 * Pointers are one (batch, head) slice's first row; q, k, v rows ldi elements apart, o, dO
 * ldo apart.
 * - loom__attn_amx_fwd_pack: k and v of a slice into w (loom__attn_amx_fwd_elems(T, D) bf16
 *   elements); then loom__attn_amx_fwd_rows: output rows [r0, r1) (f32, ldo apart) and their
 *   logsumexp, from q and w; r0 a multiple of 16.
 * - loom__attn_amx_bwd_slice: dq, dk, dv (f32, rows ldi apart, written, not added) from q, k,
 *   v, the output o (bf16), dO (f32) and lse; work: loom__attn_amx_bwd_bytes(T, D) bytes,
 *   64-byte aligned, one per thread.
 * Each call sets and releases the thread's tile configuration. */
bool loom__attn_amx_fits(int64_t D);
/* Tests: false makes bf16 attention take the f32 path (staged) even where AMX fits. */
void loom__attn_set_amx(bool on);
size_t loom__attn_amx_fwd_elems(size_t T, size_t D);
void loom__attn_amx_fwd_pack(uint16_t *w, const uint16_t *k, const uint16_t *v, size_t ld,
                             size_t T, size_t D);
void loom__attn_amx_fwd_rows(const uint16_t *w, const uint16_t *q, size_t ldi, float *o,
                             size_t ldo, float *lse, size_t T, size_t D, bool causal,
                             float scale, size_t r0, size_t r1);
size_t loom__attn_amx_bwd_bytes(size_t T, size_t D);
void loom__attn_amx_bwd_slice(void *work, const uint16_t *q, const uint16_t *k,
                              const uint16_t *v, size_t ldi, const uint16_t *o,
                              const float *go, size_t ldo, const float *lse, float *dq,
                              float *dk, float *dv, size_t T, size_t D, bool causal,
                              float scale);

LOOM__KERNEL_TABLES(loom__attn_kernels, loom__attn_kernels, loom__attn_kernels_for,
                    loom__attn_k);

#endif
