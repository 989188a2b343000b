/* gemm_amx.c: loom's own bf16 GEMM on Intel AMX tiles (TDPBF16PS), and the one place that
 * decides when loom__gemm uses it instead of oneDNN.
 *
 * Why: on an Intel Xeon with AMX (family 6 model 167, 1 thread) oneDNN 2.6's AMX matmul with
 * plain-layout operands ran 1024^3 at 0.19 of the measured TDPBF16PS peak; this kernel runs it
 * 1.05-1.3x faster, large products up to 1.46x (BENCHMARKS.md, "loom's AMX GEMM", with why 0.8
 * of that peak is out of reach on that machine: the peak loop keeps its input tiles constant,
 * and a 1024^3 product must also move its 12 MB through memory).
 *
 * The kernel (the blocking of oneDNN's brgemm and llama.cpp's AMX code):
 *   - tiles: 0-3 a 2x2 block of 16x16 f32 accumulators (a 32x32 block of C), 4-5 two A tiles
 *     (16 rows x 32 bf16), 6-7 two B tiles (16 k-pairs x 16 columns x 2: VNNI pairs); each
 *     32-deep step is 4 tile loads and 4 TDPBF16PS.
 *   - A (either storage) is packed once per product into zero-padded 16x32 tiles; B panel by
 *     panel (all of K x up to NC columns, about PANEL bytes: kept in L2 while every 32-row block
 *     of A passes over it) into VNNI tiles; both with a pair of tiles adjacent per 32-deep step
 *     (tile_at). Reading A in place (tile loads with its row stride) measured 10-20% slower.
 *   - K is walked in blocks of KC, so A's 32 x KC block stays in L1 while the panel's strips
 *     pass; between K blocks a 32x32 block's sums wait in a per-thread f32 stripe. The last
 *     K block writes C: its tiles stored into C in place where C is f32 with alpha 1, no bias
 *     and M, N multiples of 16 (beta 1 then starts the sums from C), else C = alpha * sum + bias + beta * C rounded to
 *     C's dtype (bf16: to nearest even).
 *   - threads: the caller's GEMM thread count (loom__gemm_threads, OpenMP); A and each B panel
 *     are packed by all of them, the 32-row blocks of A split between them.
 *
 * The choice (loom__gemm_prefer_amx, in gemm_amx_choice.c, which is built for every CPU while
 * this file is built for AVX-512 and AMX), per call, cheap after a one-time probe:
 *   - eligible: bf16 A and B; the active CPU level is avx512 (LOOM_CPU=avx2 or scalar route
 *     away); the CPU has AMX-TILE, AMX-BF16 and AVX512-BF16 (loom__cpu_amx_bf16) and the kernel
 *     granted this process the tile data state (arch_prctl ARCH_REQ_XCOMP_PERM, asked once in
 *     dispatch.c; refused on kernels before 5.16, and then oneDNN runs everything).
 *     loom__gemm asks only for products it runs natively in bf16 (loom__gemm_native: not under
 *     LOOM_BF16_KERNELS=widen, nor with oneDNN capped below AMX by ONEDNN_MAX_CPU_ISA, which
 *     then emulates a CPU without AMX for loom too).
 *   - auto (the default): eligible, the calling thread's GEMM thread count is 1 (the kernel
 *     splits over threads, but was measured on one), M and K at least 256, N at least 512, M N K
 *     at least 2^27 (512^3), and K at most 1024 where A is stored transposed. The GPT's products
 *     (4096 rows of 384-1536 wide, bench_amx "gpt"): AMX / oneDNN 0.66-0.86 with N 256-384
 *     (one or two B panels, A streamed past each), 0.53-0.97 for weight gradients over 4096
 *     rows (A's transposed packing), 0.92-1.14 for N 1152-1536 with K 384. Packing costs M K + K N copies per call against M N K of product, so a
 *     small M or N loses: bench_amx (family 6 model 167, 1 thread, warm and cold operands)
 *     measured AMX / oneDNN 1.05-1.46 at 1024^3 (NN, NT, TN) and 4096x4096x1024, 1.04-1.35 on
 *     the MLP's 256x1024x1024 and 1024x(1024|784)x256, 0.96-0.97 on 256x1024x784, about 1 at
 *     512^3, and 0.61-0.89 with a dimension of 10 to 128 or 256^3 NT (BENCHMARKS.md, "loom's
 *     AMX GEMM").
 *   - LOOM_GEMM_BF16=onednn in the environment (read once) never picks it, =amx picks it
 *     whenever eligible; loom__gemm_amx_set_mode does the same from code (benchmarks, tests).
 * Every transpose, leading dimension, batch stride (0 broadcasts), alpha, beta, bias and C
 * dtype of loom__gemm_args is handled here, so an eligible call never falls back. */
#include "ops/gemm_int.h"

#include <immintrin.h>
#include <stdlib.h>

#ifdef _OPENMP
#include <omp.h>
#endif

/* KC: the K block, so that A's 32 x KC block (16 KiB) stays in L1 while a panel's strips pass;
 * NC, PANEL: a B panel's most columns and about its bytes (all of K; in L2). */
enum { KC = 256, NC = 256, PANEL = 512 * 1024, TILE_ELEMS = 512 /* bf16 of a 1 KiB tile */ };

/* ---- packing ------------------------------------------------------------------------- */

/* The first n lanes (n >= 1). */
static __mmask16 mask16(int64_t n) {
  return n >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << n) - 1);
}
static __mmask32 mask32(int64_t n) {
  return n >= 32 ? (__mmask32)~0u : (__mmask32)((1u << n) - 1);
}

/* Rows r and r+1 (zero past `rows`) of 16 columns (zero past `cols`) of a [rows, ld] bf16
 * matrix at p, interleaved into 16 pairs: the 64 bytes at dst. */
static void pair_rows(const uint16_t *p, int64_t ld, int64_t r, int64_t rows, int64_t cols,
                      uint16_t *dst) {
  __mmask16 m = mask16(cols);
  __m256i r0 = r < rows ? _mm256_maskz_loadu_epi16(m, p + r * ld) : _mm256_setzero_si256();
  __m256i r1 =
      r + 1 < rows ? _mm256_maskz_loadu_epi16(m, p + (r + 1) * ld) : _mm256_setzero_si256();
  __m256i lo = _mm256_unpacklo_epi16(r0, r1), hi = _mm256_unpackhi_epi16(r0, r1);
  _mm256_storeu_si256((__m256i *)dst, _mm256_permute2x128_si256(lo, hi, 0x20));
  _mm256_storeu_si256((__m256i *)(dst + 16), _mm256_permute2x128_si256(lo, hi, 0x31));
}

/* Transposes a 16x16 matrix of 32-bit elements held in r[0..16) (row i in r[i]). */
static void transpose16(__m512i r[16]) {
  __m512i t[16];
  for (int i = 0; i < 8; i++) {
    t[2 * i] = _mm512_unpacklo_epi32(r[2 * i], r[2 * i + 1]);
    t[2 * i + 1] = _mm512_unpackhi_epi32(r[2 * i], r[2 * i + 1]);
  }
  for (int i = 0; i < 4; i++) {
    r[4 * i] = _mm512_unpacklo_epi64(t[4 * i], t[4 * i + 2]);
    r[4 * i + 1] = _mm512_unpackhi_epi64(t[4 * i], t[4 * i + 2]);
    r[4 * i + 2] = _mm512_unpacklo_epi64(t[4 * i + 1], t[4 * i + 3]);
    r[4 * i + 3] = _mm512_unpackhi_epi64(t[4 * i + 1], t[4 * i + 3]);
  }
  for (int h = 0; h < 2; h++)
    for (int i = 0; i < 4; i++) {
      t[8 * h + i] = _mm512_shuffle_i32x4(r[8 * h + i], r[8 * h + 4 + i], 0x88);
      t[8 * h + 4 + i] = _mm512_shuffle_i32x4(r[8 * h + i], r[8 * h + 4 + i], 0xdd);
    }
  for (int i = 0; i < 8; i++) {
    r[i] = _mm512_shuffle_i32x4(t[i], t[8 + i], 0x88);
    r[8 + i] = _mm512_shuffle_i32x4(t[i], t[8 + i], 0xdd);
  }
}

/* B's VNNI tiles: 16 rows of 16 (k, k+1) pairs of op(B), zero outside K x N. */

/* B stored [K, N] (ldb): rows k and k+1 of columns [n, n+32) (one cache line of each row)
 * interleaved into pairs: row (k / 2) % 16 of the tiles of strips n / 16 (at dst0) and
 * n / 16 + 1 (at dst1). */
static void pair_row(const uint16_t *B, int64_t ldb, int64_t K, int64_t N, int64_t k, int64_t n,
                     uint16_t *dst0, uint16_t *dst1) {
  const __m512i lo_idx = _mm512_set_epi64(11, 10, 3, 2, 9, 8, 1, 0);
  const __m512i hi_idx = _mm512_set_epi64(15, 14, 7, 6, 13, 12, 5, 4);
  __mmask32 m = mask32(N - n);
  __m512i r0 = k < K ? _mm512_maskz_loadu_epi16(m, B + k * ldb + n) : _mm512_setzero_si512();
  __m512i r1 =
      k + 1 < K ? _mm512_maskz_loadu_epi16(m, B + (k + 1) * ldb + n) : _mm512_setzero_si512();
  __m512i lo = _mm512_unpacklo_epi16(r0, r1), hi = _mm512_unpackhi_epi16(r0, r1);
  _mm512_storeu_si512(dst0, _mm512_permutex2var_epi64(lo, lo_idx, hi));
  _mm512_storeu_si512(dst1, _mm512_permutex2var_epi64(lo, hi_idx, hi));
}

/* B stored [N, K] (ldb): a pair is 4 contiguous bytes, so the tile of k [k, k+32) and columns
 * [n, n+16) is a 16x16 transpose of 32-bit pairs. */
static void pack_b_tile_t(const uint16_t *B, int64_t ldb, int64_t K, int64_t N, int64_t k,
                          int64_t n, uint16_t *dst) {
  __mmask32 m = mask32(K - k);
  __m512i v[16];
  for (int j = 0; j < 16; j++)
    v[j] = n + j < N ? _mm512_maskz_loadu_epi16(m, B + (n + j) * ldb + k) : _mm512_setzero_si512();
  transpose16(v);
  for (int r = 0; r < 16; r++) _mm512_storeu_si512(dst + 32 * r, v[r]);
}

/* One A tile: rows [m, m+16) x k [k, k+32) of op(A) (zero outside M x K), 16 rows of 32 bf16.
 * A stored [M, K]: masked row copies; stored [K, M]: pairs of its rows interleaved (16 x 16
 * pairs, [pair][row of op(A)]) then transposed to [row][pair]. */
static void pack_a_tile(const uint16_t *A, int64_t lda, bool trans, int64_t M, int64_t K,
                        int64_t m, int64_t k, uint16_t *dst) {
  if (!trans) {
    __mmask32 km = mask32(K - k);
    for (int r = 0; r < 16; r++)
      _mm512_storeu_si512(dst + 32 * r, m + r < M ? _mm512_maskz_loadu_epi16(
                                                        km, A + (m + r) * lda + k)
                                                  : _mm512_setzero_si512());
    return;
  }
  __m512i v[16];
  for (int p = 0; p < 16; p++) pair_rows(A + m, lda, k + 2 * p, K, M - m, (uint16_t *)&v[p]);
  transpose16(v);
  for (int r = 0; r < 16; r++) _mm512_storeu_si512(dst + 32 * r, v[r]);
}

/* ---- the product --------------------------------------------------------------------- */

typedef struct tilecfg {
  uint8_t palette, start_row, reserved[14];
  uint16_t colsb[16];
  uint8_t rows[16];
} __attribute__((packed, aligned(64))) tilecfg;

typedef struct plan {
  const loom__gemm_args *g;
  const uint16_t *A, *B; /* this batch's operands */
  char *C;
  int64_t mt, kt, nt; /* 16-row tiles of M, 32-deep chunks of K, 16-column strips of N */
  int64_t nc;         /* strips in a B panel (even) */
  int64_t kc;         /* chunks in a K block */
  uint16_t *apack;    /* A's tiles [mt][kt] */
  uint16_t *bpack;    /* the current panel's tiles [strip][kt] */
  float *sums;        /* per thread: the partial sums of a 32-row stripe, [2][nc] 16x16 tiles */
  bool direct; /* C is f32, alpha 1, no bias, M and N multiples of 16: tiles go to C as is */
} plan;

/* Where tile (i, k) of a packed operand is, in tiles: pairs of 16-row tiles (A) or 16-column
 * strips (B) interleaved chunk by chunk, [i / 2][k][i % 2], so that the two A tiles and the
 * two B tiles of each step are adjacent (two streams of 2 KiB steps). */
static int64_t tile_at(int64_t kt, int64_t i, int64_t k) { return (i / 2 * kt + k) * 2 + i % 2; }

/* C = alpha * t + bias + beta * C for rows x cols of the 16x16 f32 tile t at C's (i, j). */
static void epilogue(const plan *p, const float *t, int64_t i, int64_t j, int64_t rows,
                     int64_t cols) {
  const loom__gemm_args *g = p->g;
  __mmask16 m = mask16(cols);
  __m512 alpha = _mm512_set1_ps(g->alpha);
  __m512 bias = g->bias ? _mm512_maskz_loadu_ps(m, g->bias + j) : _mm512_setzero_ps();
  for (int64_t r = 0; r < rows; r++) {
    __m512 v = _mm512_mul_ps(alpha, _mm512_loadu_ps(t + 16 * r));
    if (g->bias) v = _mm512_add_ps(v, bias);
    size_t at = (size_t)((i + r) * g->ldc + j);
    if (g->c_dtype == LOOM_F32) {
      float *c = (float *)p->C + at;
      if (g->beta != 0.0f) v = _mm512_add_ps(v, _mm512_maskz_loadu_ps(m, c));
      _mm512_mask_storeu_ps(c, m, v);
    } else {
      uint16_t *c = (uint16_t *)p->C + at;
      if (g->beta != 0.0f) {
        __m512i w = _mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(m, c));
        v = _mm512_add_ps(v, _mm512_castsi512_ps(_mm512_slli_epi32(w, 16)));
      }
      _mm256_mask_storeu_epi16(c, m, (__m256i)_mm512_cvtneps_pbh(v));
    }
  }
}

/* The finished 16x16 f32 tile t into C at (i, j): copied as is where p->direct, else through
 * the epilogue. */
static void write_tile(const plan *p, const float *t, int64_t i, int64_t j, int64_t rows,
                       int64_t cols) {
  if (!p->direct) {
    epilogue(p, t, i, j, rows, cols);
    return;
  }
  float *c = (float *)p->C + i * p->g->ldc + j;
  for (int r = 0; r < 16; r++, c += p->g->ldc) _mm512_storeu_ps(c, _mm512_load_ps(t + 16 * r));
}

/* Applies FN(a, b, tile) to the nm x nn accumulator tiles in use (tile 2a + b). */
#define EACH_TILE(FN)                                                                              \
  do {                                                                                             \
    FN(0, 0, 0);                                                                                   \
    if (nn > 1) FN(0, 1, 1);                                                                       \
    if (nm > 1) FN(1, 0, 2);                                                                       \
    if (nm > 1 && nn > 1) FN(1, 1, 3);                                                             \
  } while (0)

/* C's 32x32 block (nm x nn tiles) at tile row mi and 16-column strip `strip` (the panel's
 * strip j) over K chunks [k0, k0 + nk): first / last K block or not. Between K blocks the
 * sums wait in `sums` (the thread's stripe, [2][nc] tiles). */
static void block(const plan *p, float *sums, int64_t mi, int nm, int64_t j, int64_t strip, int nn,
                  int64_t k0, int64_t nk, bool first, bool last) {
  const loom__gemm_args *g = p->g;
  float *c0 = p->direct ? (float *)p->C + mi * 16 * g->ldc + strip * 16 : NULL;
  size_t ldc = (size_t)g->ldc * 4;
#define SUM(a, b) (sums + ((a) * p->nc + j + (b)) * 256)
#define CTILE(a, b) (c0 + (a) * 16 * g->ldc + (b) * 16) /* only where p->direct */
  if (!first) {
#define LOAD(a, b, T) _tile_loadd(T, SUM(a, b), 64)
    EACH_TILE(LOAD);
#undef LOAD
  } else if (p->direct && g->beta != 0.0f) {
#define LOADC(a, b, T) _tile_loadd(T, CTILE(a, b), ldc)
    EACH_TILE(LOADC);
#undef LOADC
  } else {
    _tile_zero(0);
    _tile_zero(1);
    _tile_zero(2);
    _tile_zero(3);
  }
  const char *a0 = (const char *)(p->apack + tile_at(p->kt, mi, k0) * TILE_ELEMS);
  const char *b0 = (const char *)(p->bpack + tile_at(p->kt, j, k0) * TILE_ELEMS);
  const char *a1 = a0 + 1024, *b1 = b0 + 1024;
  if (nm == 2 && nn == 2) {
    for (int64_t t = 0; t < nk; t++) {
      _tile_loadd(4, a0 + t * 2048, 64);
      _tile_loadd(6, b0 + t * 2048, 64);
      _tile_loadd(7, b1 + t * 2048, 64);
      _tile_dpbf16ps(0, 4, 6);
      _tile_loadd(5, a1 + t * 2048, 64);
      _tile_dpbf16ps(1, 4, 7);
      _tile_dpbf16ps(2, 5, 6);
      _tile_dpbf16ps(3, 5, 7);
    }
  } else {
    for (int64_t t = 0; t < nk; t++) {
      _tile_loadd(4, a0 + t * 2048, 64);
      _tile_loadd(6, b0 + t * 2048, 64);
      _tile_dpbf16ps(0, 4, 6);
      if (nn > 1) {
        _tile_loadd(7, b1 + t * 2048, 64);
        _tile_dpbf16ps(1, 4, 7);
      }
      if (nm > 1) {
        _tile_loadd(5, a1 + t * 2048, 64);
        _tile_dpbf16ps(2, 5, 6);
        if (nn > 1) _tile_dpbf16ps(3, 5, 7);
      }
    }
  }
  if (last && p->direct) { /* whole tiles of an f32 C: stored in place */
#define STOREC(a, b, T) _tile_stored(T, CTILE(a, b), ldc)
    EACH_TILE(STOREC);
#undef STOREC
    return;
  }
#define STORE(a, b, T) _tile_stored(T, SUM(a, b), 64)
  EACH_TILE(STORE);
#undef STORE
  if (!last) return;
#define WRITE(a, b, T)                                                                             \
  do {                                                                                             \
    int64_t i = (mi + (a)) * 16, jj = (strip + (b)) * 16;                                          \
    int64_t rows = g->M - i < 16 ? g->M - i : 16, cols = g->N - jj < 16 ? g->N - jj : 16;        \
    write_tile(p, SUM(a, b), i, jj, rows, cols);                                                   \
  } while (0)
  EACH_TILE(WRITE);
#undef WRITE
#undef SUM
#undef CTILE
}

static void config_tiles(void) {
  tilecfg cfg;
  memset(&cfg, 0, sizeof cfg);
  cfg.palette = 1;
  for (int t = 0; t < 8; t++) cfg.colsb[t] = 64, cfg.rows[t] = 16;
  _tile_loadconfig(&cfg);
}

#ifdef _OPENMP
static int thread_num(void) { return omp_get_thread_num(); }
#else
static int thread_num(void) { return 0; }
#endif

/* One product (one batch), on a team of nthr threads. */
static void product(plan *p, int nthr) {
  const loom__gemm_args *g = p->g;
  int64_t mblocks = (p->mt + 1) / 2;
#pragma omp parallel num_threads(nthr) if (nthr > 1)
  {
    config_tiles();
    float *sums = p->sums + (size_t)thread_num() * 2 * (size_t)p->nc * 256;
#pragma omp for schedule(static)
    for (int64_t mi = 0; mi < p->mt; mi++)
      for (int64_t ki = 0; ki < p->kt; ki++)
        pack_a_tile(p->A, g->lda, g->trans_a, g->M, g->K, mi * 16, ki * 32,
                    p->apack + tile_at(p->kt, mi, ki) * TILE_ELEMS);
    for (int64_t n0 = 0; n0 < p->nt; n0 += p->nc) {
      int64_t ns = p->nt - n0 < p->nc ? p->nt - n0 : p->nc;
      if (!g->trans_b) {
#pragma omp for schedule(static)
        for (int64_t kp = 0; kp < p->kt * 16; kp++) /* a pair of B's rows across the panel */
          for (int64_t j = 0; j < ns; j += 2) {
            uint16_t *row = p->bpack + tile_at(p->kt, j, kp / 16) * TILE_ELEMS + kp % 16 * 32;
            pair_row(p->B, g->ldb, g->K, g->N, 2 * kp, (n0 + j) * 16, row, row + TILE_ELEMS);
          }
      } else {
#pragma omp for schedule(static)
        for (int64_t s = 0; s < ns * p->kt; s++) /* chunk by chunk, a strip each */
          pack_b_tile_t(p->B, g->ldb, g->K, g->N, s / ns * 32, (n0 + s % ns) * 16,
                        p->bpack + tile_at(p->kt, s % ns, s / ns) * TILE_ELEMS);
      }
#pragma omp for schedule(static)
      for (int64_t mb = 0; mb < mblocks; mb++) {
        int nm = p->mt - 2 * mb >= 2 ? 2 : 1;
        for (int64_t k0 = 0; k0 < p->kt; k0 += p->kc) {
          int64_t nk = p->kt - k0 < p->kc ? p->kt - k0 : p->kc;
          for (int64_t j = 0; j < ns; j += 2)
            block(p, sums, 2 * mb, nm, j, n0 + j, ns - j >= 2 ? 2 : 1, k0, nk, k0 == 0,
                  k0 + nk == p->kt);
        }
      }
    }
    _tile_release();
  }
}

int loom__gemm_bf16_amx_run(const loom__gemm_args *g) {
  static const char who[] = "loom__gemm_bf16_amx";
  int rc = LOOM_OK;
  plan p = {.g = g, .mt = (g->M + 15) / 16, .kt = (g->K + 31) / 32, .nt = (g->N + 15) / 16};
  p.direct = g->c_dtype == LOOM_F32 && g->alpha == 1.0f && !g->bias && g->M % 16 == 0 &&
             g->N % 16 == 0;
  /* a B panel of about PANEL bytes (all of K), an even number of strips */
  p.nc = PANEL / (p.kt * 2048) / 2 * 2;
  p.nc = p.nc < 2 ? 2 : p.nc > NC / 16 ? NC / 16 : p.nc;
  p.kc = KC / 32;
  int nthr = loom__gemm_threads();
  size_t abytes, bbytes, sbytes;
  if (!loom__mul_ok((size_t)(p.mt + 1) * (size_t)p.kt, 1024, &abytes) ||
      !loom__mul_ok((size_t)p.nc * (size_t)p.kt, 1024, &bbytes) ||
      !loom__mul_ok((size_t)nthr * 2 * (size_t)p.nc, 1024, &sbytes))
    return loom__fail(LOOM_EOVERFLOW, "%s: work buffers for %lldx%lldx%lld overflow size_t", who,
                      (long long)g->M, (long long)g->N, (long long)g->K);
  LOOM__GEMM_ALLOC(p.apack, abytes, who, "the packed A tiles");
  LOOM__GEMM_ALLOC(p.bpack, bbytes, who, "the packed B panel");
  LOOM__GEMM_ALLOC(p.sums, sbytes, who, "the f32 partial sums");
  if (loom__dry()) goto done;
  for (int64_t b = 0; b < g->batch; b++) {
    size_t ia = g->batch > 1 ? (size_t)(b * g->stride_a) : 0;
    size_t ib = g->batch > 1 ? (size_t)(b * g->stride_b) : 0;
    size_t ic = g->batch > 1 ? (size_t)(b * g->stride_c) : 0;
    p.A = (const uint16_t *)g->A + ia, p.B = (const uint16_t *)g->B + ib;
    p.C = (char *)g->C + ic * loom_dtype_size(g->c_dtype);
    product(&p, nthr);
  }
done:
  loom__free(p.apack);
  loom__free(p.bpack);
  loom__free(p.sums);
  return rc;
}
