/* gemm_avx512.c: loom's own AVX-512 GEMM for 16-bit operands on CPUs where oneDNN's bf16 /
 * f16 kernels are slower than f32 (Intel without AMX; gemm_avx512.h says when loom__gemm takes
 * it). Built with -mavx512f -mavx512bw -mavx512vl -mf16c.
 *
 * Why: there loom__gemm widened bf16 / f16 operands to f32 copies for oneDNN's f32 kernels
 * (gemm_dnnl.c's gemm_widened), writing and reading every operand once more and a 16-bit C
 * once more again: with autocast's own rounding that made the MLP's bf16 step 0.85x the f32
 * step (BENCHMARKS.md, "bf16 kernels chosen by speed"). Here, as in gemm_avx2.c on AVX2, the
 * widening happens inside the packing that a fast GEMM does anyway, and a 16-bit C is rounded in
 * the micro-kernel's epilogue, so no widened copy exists. VDPBF16PS is not used: on these Intel
 * cores it issues at half the FMA rate and does as many products, so its peak is FMA's.
 *
 * Design: gemm_packed.h's loops (BLIS / OpenBLAS SkylakeX, as gemm_avx2.c) around a 12 x 32
 * micro-kernel: op(B) packed (widened to f32) in slivers of NR = 32 columns, op(A) in slivers
 * of MR = 12 rows, both k-major; the tile of C lives in 24 zmm registers and, per k, 12 values
 * of A are broadcast (from memory, folded into the FMA) against 2 vectors of B (24 FMAs).
 * Ragged edges are masked loads and stores (zeros packed past them); operands stored the other
 * way round are transposed 16 x 16 in registers as they are packed. Sums are f32 throughout;
 * the epilogue applies alpha, adds the bias and beta * C (or the partial sums) and stores in
 * C's dtype (bf16: nearest even, NaN kept, as loom_convert). The result is the f32 product of
 * the operands' values, as every loom__gemm path gives; only the order of the sums differs. */
#include "ops/gemm_avx512.h"

#include "core/kernels/bf16_avx512.h"

#include <immintrin.h>
#include <string.h>

/* Measured on the MLP's products (bench_gemm_avx512, family 6 model 167, 1 thread): a 16-bit
 * C's K (784, 1024) in one piece, its B slivers read from L2, beat 256-deep pieces in L1 whose
 * partial sums go through the f32 block 3 times (1.3x on the forward's 256x1024x784); an f32
 * C's B blocks of 256 rows across all of N beat all of K in narrower blocks (A packed once). */
enum {
  MR = 12,
  NR = 32,
  KC = 1024, /* k per packed A block at most (48 KiB a 12-row sliver: L2) */
  MC = 48,   /* rows per packed A block (fewer: 1.03x on the products of the MLP step) */
  NC = 1536, /* columns per B block at most */
  KB32 = 256, /* an f32 C's B block: 256 rows at least (a B sliver in L1) */
};
/* A packed B block at most, in f32 elements: for a 16-bit C all of K, 1 MiB (L2); for an f32
 * C, 1 MiB (the weight gradient's long K is cut in blocks whose partial sums go through C). */
#define BBLOCK_C16 ((int64_t)256 * 1024)
#define BBLOCK_F32 ((int64_t)256 * 1024)

#include "ops/gemm_packed.h" /* the loops around the kernel (after the constants it reads) */

/* ---- loading and storing 16-bit or f32 elements ---------------------------------------- */

/* The first n of 16 lanes as a mask (none for n <= 0, all for n >= 16). */
static inline __mmask16 lanes(int64_t n) {
  return n >= 16 ? (__mmask16)0xffff : n <= 0 ? (__mmask16)0 : (__mmask16)((1u << n) - 1);
}

/* 16 elements from p + i, the lanes of mask only (others zero), widened (exact). */
static inline __m512 load16(const void *p, loom_dtype dt, int64_t i, __mmask16 mask) {
  if (dt == LOOM_F32) return _mm512_maskz_loadu_ps(mask, (const float *)p + i);
  __m256i h = _mm256_maskz_loadu_epi16(mask, (const uint16_t *)p + i);
  if (dt == LOOM_F16) return _mm512_cvtph_ps(h);
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}

/* The lanes of mask of v stored at p + i in dtype dt (16-bit: rounded to nearest even, as
 * loom_convert). */
static inline void store16(void *p, loom_dtype dt, int64_t i, __m512 v, __mmask16 mask) {
  if (dt == LOOM_F32) {
    _mm512_mask_storeu_ps((float *)p + i, mask, v);
    return;
  }
  __m256i h = dt == LOOM_F16 ? _mm512_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT)
                             : loom__bf16_round_avx512(_mm512_castps_si512(v));
  _mm256_mask_storeu_epi16((uint16_t *)p + i, mask, h);
}

/* 16 x 16 transpose of r[0..15] in place: pairs, then quads within 128-bit lanes, then the
 * lanes. */
static inline void tr16x16(__m512 r[16]) {
  __m512 t[16], v[16];
  for (int i = 0; i < 16; i += 2) {
    t[i] = _mm512_unpacklo_ps(r[i], r[i + 1]);
    t[i + 1] = _mm512_unpackhi_ps(r[i], r[i + 1]);
  }
  for (int g = 0; g < 4; g++) { /* v[4 q + g]: column q (of each lane) of rows 4 g .. 4 g + 3 */
    v[0 + g] = _mm512_shuffle_ps(t[4 * g], t[4 * g + 2], 0x44);
    v[4 + g] = _mm512_shuffle_ps(t[4 * g], t[4 * g + 2], 0xee);
    v[8 + g] = _mm512_shuffle_ps(t[4 * g + 1], t[4 * g + 3], 0x44);
    v[12 + g] = _mm512_shuffle_ps(t[4 * g + 1], t[4 * g + 3], 0xee);
  }
  for (int q = 0; q < 4; q++) { /* lane L of v[4 q + 0..3] is row 4 L + q of the result */
    __m512 u0 = _mm512_shuffle_f32x4(v[4 * q], v[4 * q + 1], 0x44);
    __m512 u1 = _mm512_shuffle_f32x4(v[4 * q], v[4 * q + 1], 0xee);
    __m512 u2 = _mm512_shuffle_f32x4(v[4 * q + 2], v[4 * q + 3], 0x44);
    __m512 u3 = _mm512_shuffle_f32x4(v[4 * q + 2], v[4 * q + 3], 0xee);
    r[q] = _mm512_shuffle_f32x4(u0, u2, 0x88);
    r[4 + q] = _mm512_shuffle_f32x4(u0, u2, 0xdd);
    r[8 + q] = _mm512_shuffle_f32x4(u1, u3, 0x88);
    r[12 + q] = _mm512_shuffle_f32x4(u1, u3, 0xdd);
  }
}

/* ---- packing ----------------------------------------------------------------------------- */

/* Rows [r0, r0 + nr) (nr <= 16) of a transposed walk: t[q] is op(X)'s line r0 + q (its elements
 * contiguous, `cs` = 1 apart) at positions [c0, c0 + 16), zeros past nc of them and past nr
 * lines; transposed, so t[c] holds position c0 + c of the nr lines. */
static inline void load_tr(const opnd *x, int64_t r0, int64_t nr, int64_t stride, int64_t c0,
                           int64_t nc, __m512 t[16]) {
  __mmask16 m = lanes(nc);
  for (int q = 0; q < 16; q++)
    t[q] = q < nr ? load16(x->p, x->dt, (r0 + q) * stride + c0, m) : _mm512_setzero_ps();
  tr16x16(t);
}

/* gemm_packed.h's pack_b: B's rows a row at a time, or 16 x 16 blocks of B stored [N, K]
 * transposed; masked at the edges. */
static void pack_b(const opnd *b, int64_t k0, int64_t kb, int64_t j0, int64_t nc, int64_t s0,
                   int64_t s1, float *dst) {
  if (b->cs == 1) { /* rows of op(B) contiguous: a row at a time, in order */
    for (int64_t k = 0; k < kb; k++) {
      int64_t o = (k0 + k) * b->rs + j0;
      for (int64_t s = s0; s < s1; s++) {
        float *d = dst + s * kb * NR + k * NR;
        int64_t n = nc - s * NR;
        _mm512_store_ps(d, load16(b->p, b->dt, o + s * NR, lanes(n)));
        _mm512_store_ps(d + 16, load16(b->p, b->dt, o + s * NR + 16, lanes(n - 16)));
      }
    }
    return;
  }
  /* columns of op(B) contiguous (B stored [N, K]): 16 x 16 blocks, transposed */
  for (int64_t s = s0; s < s1; s++)
    for (int h = 0; h < 2; h++) {
      int64_t j = j0 + s * NR + 16 * h, n = nc - s * NR - 16 * h;
      float *d = dst + s * kb * NR + 16 * h;
      for (int64_t k = 0; k < kb; k += 16) {
        __m512 t[16];
        int64_t kt = kb - k < 16 ? kb - k : 16;
        load_tr(b, j, n < 0 ? 0 : n, b->cs, k0 + k, kt, t);
        for (int64_t q = 0; q < kt; q++) _mm512_store_ps(d + (k + q) * NR, t[q]);
      }
    }
}

/* gemm_packed.h's pack_a: a k's rows in one masked load where A is stored [K, M], else 12 rows x
 * 16 k transposed a step. */
static void pack_a(const opnd *a, int64_t i0, int64_t mc, int64_t k0, int64_t kc, float *dst,
                   int64_t m_total) {
  (void)m_total; /* masked loads stop at mc */
  const __mmask16 m12 = lanes(MR);
  int64_t ns = (mc + MR - 1) / MR;
  if (a->rs == 1) { /* columns contiguous (A stored [K, M]): a k's rows in one sweep */
    size_t es = esize(a->dt);
    for (int64_t k = 0; k < kc; k++) {
      int64_t o = (k0 + k) * a->cs + i0;
      if (k + 8 < kc) { /* rows lda apart, each on its own page: ahead of the prefetcher */
        const char *ahead = (const char *)a->p + (size_t)(o + 8 * a->cs) * es;
        for (int64_t x = 0; x < mc * (int64_t)es; x += 64) _mm_prefetch(ahead + x, _MM_HINT_T0);
      }
      for (int64_t s = 0; s < ns; s++)
        _mm512_mask_storeu_ps(dst + s * kc * MR + k * MR, m12,
                              load16(a->p, a->dt, o + s * MR, lanes(mc - s * MR)));
    }
    return;
  }
  /* rows contiguous (A stored [M, K]): 12 rows x 16 k a step, transposed */
  for (int64_t s = 0; s < ns; s++) {
    int64_t m = mc - s * MR < MR ? mc - s * MR : MR;
    float *d = dst + s * kc * MR;
    for (int64_t k = 0; k < kc; k += 16) {
      __m512 t[16];
      int64_t kt = kc - k < 16 ? kc - k : 16;
      load_tr(a, i0 + s * MR, m, a->rs, k0 + k, kt, t);
      for (int64_t q = 0; q < kt; q++) _mm512_mask_storeu_ps(d + (k + q) * MR, m12, t[q]);
    }
  }
}

/* ---- the micro-kernel and its epilogue --------------------------------------------------- */

/* t[12][32] = sum over kc of a[k][0..11] (x) b[k][0..31]. The loops over the tile are unrolled
 * (constant bounds), so its 24 sums live in registers. */
static inline void micro_kernel(int64_t kc, const float *a, const float *b, float *t) {
  __m512 c[MR][2];
#pragma GCC unroll 12
  for (int r = 0; r < MR; r++) c[r][0] = c[r][1] = _mm512_setzero_ps();
#pragma GCC unroll 2
  for (int64_t k = 0; k < kc; k++) {
    __m512 b0 = _mm512_load_ps(b), b1 = _mm512_load_ps(b + 16);
#pragma GCC unroll 12
    for (int r = 0; r < MR; r++) {
      __m512 x = _mm512_set1_ps(a[r]);
      c[r][0] = _mm512_fmadd_ps(x, b0, c[r][0]);
      c[r][1] = _mm512_fmadd_ps(x, b1, c[r][1]);
    }
    a += MR, b += NR;
  }
#pragma GCC unroll 12
  for (int r = 0; r < MR; r++) {
    _mm512_store_ps(t + r * NR, c[r][0]);
    _mm512_store_ps(t + r * NR + 16, c[r][1]);
  }
}

static void epilogue(const float *t, int64_t m, int64_t n, const tile_io *io) {
  __m512 al = _mm512_set1_ps(io->alpha);
  bool one = io->alpha == 1.0f;
  for (int h = 0; h < 2 && 16 * h < n; h++) {
    __mmask16 mk = lanes(n - 16 * h);
    __m512 bias = io->bias ? _mm512_maskz_loadu_ps(mk, io->bias + 16 * h) : _mm512_setzero_ps();
    for (int64_t r = 0; r < m; r++) {
      __m512 v = _mm512_load_ps(t + r * NR + 16 * h);
      if (!one) v = _mm512_mul_ps(v, al);
      if (io->prev) v = _mm512_add_ps(v, load16(io->prev, io->prev_dt, r * io->ldp + 16 * h, mk));
      if (io->bias) v = _mm512_add_ps(v, bias);
      store16(io->out, io->out_dt, r * io->ldo + 16 * h, v, mk);
    }
  }
}

int loom__gemm_avx512(const loom__gemm_args *g) { return gemm_packed(g, "loom__gemm_avx512"); }
