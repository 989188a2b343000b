/* gemm_avx2.c: loom's own AVX2 + FMA GEMM for 16-bit operands on CPUs without bf16 / f16
 * arithmetic (gemm_avx2.h says when loom__gemm takes it). Built with -mavx2 -mfma -mf16c.
 *
 * Why: widening bf16 / f16 operands to f32 copies before an f32 GEMM (gemm_dnnl.c's
 * gemm_widened) writes and reads every operand once more, and a 16-bit C once more again; on
 * an AVX2-only CPU that made a bf16 autocast GPT step slower than the f32 one. Here the
 * widening happens inside the packing that any fast GEMM does anyway, and a 16-bit C is
 * rounded in the micro-kernel's epilogue, so no widened copy exists.
 *
 * Design (BLIS / OpenBLAS Haswell; the loops are gemm_packed.h's, shared with gemm_avx512.c):
 * op(B) is packed (widened to f32) into slivers of NR = 16 columns, op(A) into slivers of MR = 6
 * rows, both k-major; the micro-kernel holds a 6 x 16 tile of C in 12 ymm registers and, per
 * k, broadcasts 6 values of A against 2 vectors of B (12 FMAs). Sums are f32 throughout; the
 * tile's epilogue applies alpha, adds the bias and beta * C (or the partial sum of the earlier
 * KC blocks) and stores in C's dtype (bf16: nearest even, NaN kept, as loom_convert). The
 * result is the f32 product of the operands' values, as every loom__gemm path gives; only the
 * order of the sums differs. */
#include "ops/gemm_avx2.h"

#include "core/kernels/bf16_avx2.h"

#include <immintrin.h>
#include <string.h>

enum {
  MR = 6,
  NR = 16,
  KC = 384,  /* k per packed A block at most: a B sliver (KC x 16 f32, 24 KiB) in L1 */
  MC = 96,   /* rows per packed A block (144 KiB at KC: L2) */
  NC = 1536, /* columns per B block at most */
  KB32 = KC, /* an f32 C's B block: KC rows at least */
};
/* A packed B block at most: for a 16-bit C, 2.5 MiB (a forward linear's whole weight at
 * K = 384, so its activations are packed once); for an f32 C, 1 MiB (L2: the weight gradient's
 * long K is cut in blocks whose partial sums go through C; 2.5 MiB ran its products 5-10%
 * slower, bench_gemm_avx2). */
#define BBLOCK_C16 ((int64_t)640 * 1024)
#define BBLOCK_F32 ((int64_t)256 * 1024)

#include "ops/gemm_packed.h" /* the loops around the kernel (after the constants it reads) */

/* ---- loading and storing 16-bit or f32 elements ---------------------------------------- */

static inline float get1(const void *p, loom_dtype dt, int64_t i) {
  if (dt == LOOM_F32) return ((const float *)p)[i];
  uint16_t h = ((const uint16_t *)p)[i];
  if (dt == LOOM_F16) return _cvtsh_ss(h);
  uint32_t u = (uint32_t)h << 16;
  float f;
  memcpy(&f, &u, sizeof f);
  return f;
}

/* 8 elements from p + i, widened (exact). */
static inline __m256 load8(const void *p, loom_dtype dt, int64_t i) {
  if (dt == LOOM_F32) return _mm256_loadu_ps((const float *)p + i);
  __m128i h = _mm_loadu_si128((const __m128i *)((const uint16_t *)p + i));
  if (dt == LOOM_F16) return _mm256_cvtph_ps(h);
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}

/* 8 f32 stored at p + i in dtype dt (16-bit: rounded to nearest even, as loom_convert). */
static inline void store8(void *p, loom_dtype dt, int64_t i, __m256 v) {
  if (dt == LOOM_F32) {
    _mm256_storeu_ps((float *)p + i, v);
    return;
  }
  __m128i h;
  if (dt == LOOM_F16) {
    h = _mm256_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT);
  } else {
    __m256i r = loom__bf16_round_avx2(_mm256_castps_si256(v));
    h = _mm_packus_epi32(_mm256_castsi256_si128(r), _mm256_extracti128_si256(r, 1));
  }
  _mm_storeu_si128((__m128i *)((uint16_t *)p + i), h);
}

/* 8 x 8 transpose of r[0..7] in place. */
static inline void tr8x8(__m256 r[8]) {
  __m256 t0 = _mm256_unpacklo_ps(r[0], r[1]), t1 = _mm256_unpackhi_ps(r[0], r[1]);
  __m256 t2 = _mm256_unpacklo_ps(r[2], r[3]), t3 = _mm256_unpackhi_ps(r[2], r[3]);
  __m256 t4 = _mm256_unpacklo_ps(r[4], r[5]), t5 = _mm256_unpackhi_ps(r[4], r[5]);
  __m256 t6 = _mm256_unpacklo_ps(r[6], r[7]), t7 = _mm256_unpackhi_ps(r[6], r[7]);
  __m256 u0 = _mm256_shuffle_ps(t0, t2, 0x44), u1 = _mm256_shuffle_ps(t0, t2, 0xee);
  __m256 u2 = _mm256_shuffle_ps(t1, t3, 0x44), u3 = _mm256_shuffle_ps(t1, t3, 0xee);
  __m256 u4 = _mm256_shuffle_ps(t4, t6, 0x44), u5 = _mm256_shuffle_ps(t4, t6, 0xee);
  __m256 u6 = _mm256_shuffle_ps(t5, t7, 0x44), u7 = _mm256_shuffle_ps(t5, t7, 0xee);
  r[0] = _mm256_permute2f128_ps(u0, u4, 0x20);
  r[1] = _mm256_permute2f128_ps(u1, u5, 0x20);
  r[2] = _mm256_permute2f128_ps(u2, u6, 0x20);
  r[3] = _mm256_permute2f128_ps(u3, u7, 0x20);
  r[4] = _mm256_permute2f128_ps(u0, u4, 0x31);
  r[5] = _mm256_permute2f128_ps(u1, u5, 0x31);
  r[6] = _mm256_permute2f128_ps(u2, u6, 0x31);
  r[7] = _mm256_permute2f128_ps(u3, u7, 0x31);
}

/* ---- packing ----------------------------------------------------------------------------- */

/* op(B)[k0, k0 + kb) x [j0, j0 + nc), slivers [s0, s1) of NR columns: sliver s holds, for
 * each k, the 16 values of columns j0 + 16 s .. (zeros past nc). */
static void pack_b(const opnd *b, int64_t k0, int64_t kb, int64_t j0, int64_t nc, int64_t s0,
                   int64_t s1, float *dst) {
  int64_t full = nc / NR < s1 ? nc / NR : s1; /* slivers of 16 whole columns end here */
  int64_t done = s0;                           /* slivers [s0, done) packed */
  if (b->cs == 1 && full > s0) { /* rows of op(B) contiguous: a row at a time, in order */
    for (int64_t k = 0; k < kb; k++) {
      int64_t o = (k0 + k) * b->rs + j0;
      for (int64_t s = s0; s < full; s++) {
        float *d = dst + s * kb * NR + k * NR;
        _mm256_store_ps(d, load8(b->p, b->dt, o + s * NR));
        _mm256_store_ps(d + 8, load8(b->p, b->dt, o + s * NR + 8));
      }
    }
    done = full;
  }
  for (int64_t s = done; s < s1; s++) {
    int64_t j = j0 + s * NR, n = nc - s * NR < NR ? nc - s * NR : NR;
    float *d = dst + s * kb * NR;
    int64_t k = 0;
    if (n == NR && b->rs == 1) /* columns contiguous (B stored [N, K]): 8 x 8 blocks */
      for (; k + 8 <= kb; k += 8)
        for (int h = 0; h < 2; h++) {
          __m256 r[8];
          for (int c = 0; c < 8; c++) r[c] = load8(b->p, b->dt, (j + 8 * h + c) * b->cs + k0 + k);
          tr8x8(r);
          for (int q = 0; q < 8; q++) _mm256_store_ps(d + (k + q) * NR + 8 * h, r[q]);
        }
    for (; k < kb; k++)
      for (int c = 0; c < NR; c++)
        d[k * NR + c] = c < n ? get1(b->p, b->dt, (k0 + k) * b->rs + (j + c) * b->cs) : 0.0f;
  }
}

/* op(A)[i0, i0 + mc) x [k0, k0 + kc) into slivers of MR rows: sliver s holds, for each k, the
 * 6 values of rows i0 + 6 s .. (zeros past mc). dst has 8 floats of room past the end (the
 * 8-wide stores below overlap the next k's place and are overwritten by it). */
static void pack_a(const opnd *a, int64_t i0, int64_t mc, int64_t k0, int64_t kc, float *dst,
                   int64_t m_total) {
  int64_t full = mc / MR; /* slivers of 6 whole rows */
  int64_t vec = 0;        /* of them, those the A^T way below packs */
  if (a->rs == 1) {       /* columns contiguous (A stored [K, M]): a k's rows in one sweep */
    while (vec < full && i0 + vec * MR + 8 <= m_total) vec++;
    size_t es = esize(a->dt);
    /* a sliver at a time, so that the stores go to one place in order (16 slivers written
     * side by side, kc * 24 bytes apart, would share a few L1 sets); the first sliver's pass
     * prefetches the whole of each row ahead. Each 8-wide store's last 2 floats land on the
     * next k's place, or past the sliver on the next one's first k, written after it (or on
     * dst's 8 floats of room). */
    for (int64_t s = 0; s < vec; s++) {
      float *d = dst + s * kc * MR;
      const char *src = (const char *)a->p + (size_t)(k0 * a->cs + i0 + s * MR) * es;
      size_t ld = (size_t)a->cs * es;
      for (int64_t k = 0; k < kc; k++, src += ld) {
        if (s == 0 && k + 8 < kc) /* rows lda apart, each on its own page */
          for (int64_t x = 0; x < vec * MR * (int64_t)es; x += 64)
            _mm_prefetch(src + 8 * ld + (size_t)x, _MM_HINT_T0);
        _mm256_storeu_ps(d + k * MR, load8(src, a->dt, 0));
      }
    }
  }
  for (int64_t s = vec; s * MR < mc; s++) {
    int64_t i = i0 + s * MR, m = mc - s * MR < MR ? mc - s * MR : MR;
    float *d = dst + s * kc * MR;
    int64_t k = 0;
    if (m == MR && a->cs == 1) { /* rows contiguous (A stored [M, K]): 6 rows x 8 k a step */
      for (; k + 8 <= kc; k += 8) {
        __m256 r[8];
        for (int q = 0; q < MR; q++) r[q] = load8(a->p, a->dt, (i + q) * a->rs + k0 + k);
        r[6] = r[7] = _mm256_setzero_ps();
        tr8x8(r);
        for (int q = 0; q < 8; q++) _mm256_storeu_ps(d + (k + q) * MR, r[q]);
      }
    }
    for (; k < kc; k++)
      for (int q = 0; q < MR; q++)
        d[k * MR + q] = q < m ? get1(a->p, a->dt, (i + q) * a->rs + (k0 + k) * a->cs) : 0.0f;
  }
}

/* ---- the micro-kernel and its epilogue --------------------------------------------------- */

/* t[6][16] = sum over kc of a[k][0..5] (x) b[k][0..15]. The loops over the tile are unrolled
 * (constant bounds), so its 12 sums live in registers. */
static inline void micro_kernel(int64_t kc, const float *a, const float *b, float *t) {
  __m256 c[MR][2];
#pragma GCC unroll 6
  for (int r = 0; r < MR; r++) c[r][0] = c[r][1] = _mm256_setzero_ps();
#pragma GCC unroll 4
  for (int64_t k = 0; k < kc; k++) {
    __m256 b0 = _mm256_load_ps(b), b1 = _mm256_load_ps(b + 8);
#pragma GCC unroll 6
    for (int r = 0; r < MR; r++) {
      __m256 x = _mm256_broadcast_ss(a + r);
      c[r][0] = _mm256_fmadd_ps(x, b0, c[r][0]);
      c[r][1] = _mm256_fmadd_ps(x, b1, c[r][1]);
    }
    a += MR, b += NR;
  }
#pragma GCC unroll 6
  for (int r = 0; r < MR; r++) {
    _mm256_store_ps(t + r * NR, c[r][0]);
    _mm256_store_ps(t + r * NR + 8, c[r][1]);
  }
}

static void epilogue(const float *t, int64_t m, int64_t n, const tile_io *io) {
  __m256 al = _mm256_set1_ps(io->alpha);
  bool one = io->alpha == 1.0f;
  if (n == NR) {
    for (int64_t r = 0; r < m; r++)
      for (int h = 0; h < 2; h++) {
        __m256 v = _mm256_load_ps(t + r * NR + 8 * h);
        if (!one) v = _mm256_mul_ps(v, al);
        if (io->prev) v = _mm256_add_ps(v, load8(io->prev, io->prev_dt, r * io->ldp + 8 * h));
        if (io->bias) v = _mm256_add_ps(v, _mm256_loadu_ps(io->bias + 8 * h));
        store8(io->out, io->out_dt, r * io->ldo + 8 * h, v);
      }
    return;
  }
  for (int64_t r = 0; r < m; r++) { /* a ragged tile: through a row in f32 */
    float row[NR];
    for (int64_t c = 0; c < n; c++) {
      float v = t[r * NR + c] * io->alpha;
      if (io->prev) v += get1(io->prev, io->prev_dt, r * io->ldp + c);
      if (io->bias) v += io->bias[c];
      row[c] = v;
    }
    size_t es = esize(io->out_dt);
    loom_convert(row, LOOM_F32, (char *)io->out + (size_t)(r * io->ldo) * es, io->out_dt,
                 (size_t)n);
  }
}

int loom__gemm_avx2(const loom__gemm_args *g) { return gemm_packed(g, "loom__gemm_avx2"); }
