/* attn_amx.c: fused attention's products on AMX tiles (TDPBF16PS: bf16 pairs, f32 sums), for
 * bf16 q, k and v where loom__cpu_amx_bf16() says the CPU, the kernel and the level allow it
 * and the head width is a multiple of 32 (attn_int.h, "AMX"). The recurrence is attn_fused.c's:
 * forward walks 16 query rows at a time over blocks of 64 keys with the online softmax in f32
 * (running max and sum, the output rescaled when the max grows); backward (FlashAttention-2)
 * recomputes p from the logsumexp, tile by tile (32 query rows by 32 keys). What changes is
 * that the products (q k^T, p v; in backward q k^T, dO v^T, ds k, ds^T q, p^T dO) take bf16
 * operands: p, ds and dO are rounded to bf16 before their products, as a bf16 matmul would
 * (PyTorch's autocast runs these products as bf16 matmuls); every sum is f32. All tiles are
 * 16 rows x 64 bytes: an A tile 16 rows x 32 bf16, a B tile 16 pairs of rows x 16 columns
 * (VNNI: the two rows of a pair interleaved), a C tile 16 x 16 f32. Operands are packed per
 * (batch, head) slice into buffers padded with zeros to a multiple of 64 rows, so no tile reads
 * past a tensor. Built with -mamx-tile -mamx-bf16 -mavx512f -mavx512bw -mavx512bf16. */
#include "ops/attn_int.h"

#include <immintrin.h>
#include <string.h>

enum { FB = 64 /* keys a forward block */, BT = 32 /* a backward tile's rows and keys */ };

typedef struct tilecfg {
  uint8_t palette, start_row, reserved[14];
  uint16_t colsb[16];
  uint8_t rows[16];
} tilecfg;

/* Every tile 16 rows x 64 bytes (loaded at the start of each call: oneDNN's AMX kernels set
 * their own configuration on the same thread between our calls). */
static void tiles_on(void) {
  tilecfg c;
  memset(&c, 0, sizeof c);
  c.palette = 1;
  for (int t = 0; t < 8; t++) {
    c.colsb[t] = 64;
    c.rows[t] = 16;
  }
  _tile_loadconfig(&c);
}

static size_t pad64(size_t T) { return (T + 63) / 64 * 64; }

size_t loom__attn_amx_fwd_elems(size_t T, size_t D) { return 2 * pad64(T) * D; }

size_t loom__attn_amx_bwd_bytes(size_t T, size_t D) {
  size_t Tp = pad64(T);
  return 7 * Tp * D * sizeof(uint16_t) + 3 * Tp * D * sizeof(float) + Tp * sizeof(float);
}

/* dst [Tp, D] bf16 rows: src's T rows (ld apart), then zeros. */
static void rows_bf16(uint16_t *dst, const uint16_t *src, size_t ld, size_t T, size_t D) {
  size_t Tp = pad64(T);
  for (size_t i = 0; i < T; i++) memcpy(dst + i * D, src + i * ld, D * sizeof *dst);
  memset(dst + T * D, 0, (Tp - T) * D * sizeof *dst);
}

/* The same from f32 rows, rounded to nearest even. */
static void rows_f32(uint16_t *dst, const float *src, size_t ld, size_t T, size_t D) {
  size_t Tp = pad64(T);
  for (size_t i = 0; i < T; i++)
    for (size_t d = 0; d < D; d += 32) { /* D % 32 == 0 */
      __m512bh h = _mm512_cvtne2ps_pbh(_mm512_loadu_ps(src + i * ld + d + 16),
                                       _mm512_loadu_ps(src + i * ld + d));
      _mm512_storeu_si512(dst + i * D + d, (__m512i)h);
    }
  memset(dst + T * D, 0, (Tp - T) * D * sizeof *dst);
}

/* dst [D/2, Tp] pairs: dst[p][i] = (src[i][2p], src[i][2p+1]), zero for i >= T: a B operand
 * whose K runs over the head's width (scores q k^T, dO v^T). */
static void pairs_of_cols(uint32_t *dst, const uint16_t *src, size_t ld, size_t T, size_t D) {
  size_t Tp = pad64(T), P = D / 2; /* P a multiple of 16 */
  /* 16 x 16 words at a time through registers: four rounds of block swaps (blocks of 8, 4, 2,
   * 1 words: row r's second half trades places with row r + b's first half) transpose it */
  static const int b_of[4] = {8, 4, 2, 1};
  __m512i lo[4], hi[4];
  for (int k = 0; k < 4; k++) {
    int b = b_of[k], il[16], ih[16];
    for (int j = 0; j < 16; j++) {
      il[j] = j & b ? 16 + j - b : j;
      ih[j] = j & b ? 16 + j : j + b;
    }
    lo[k] = _mm512_loadu_si512(il);
    hi[k] = _mm512_loadu_si512(ih);
  }
  for (size_t i = 0; i < Tp; i += 16)
    for (size_t p = 0; p < P; p += 16) {
      __m512i r[16];
      for (size_t u = 0; u < 16; u++)
        r[u] = i + u < T ? _mm512_loadu_si512(src + (i + u) * ld + 2 * p) : _mm512_setzero_si512();
      for (int k = 0; k < 4; k++)
        for (int u = 0; u < 16; u++)
          if (!(u & b_of[k])) {
            __m512i x = r[u], y = r[u + b_of[k]];
            r[u] = _mm512_permutex2var_epi32(x, lo[k], y);
            r[u + b_of[k]] = _mm512_permutex2var_epi32(x, hi[k], y);
          }
      for (size_t u = 0; u < 16; u++) _mm512_storeu_si512(dst + (p + u) * Tp + i, r[u]);
    }
}

/* dst [Tp/2, D] pairs: dst[i][d] = (src[2i][d], src[2i+1][d]), rows past T zero: a B operand
 * whose K runs over rows (p v, ds k, ds^T q, p^T dO). */
static void pairs_of_rows(uint32_t *dst, const uint16_t *src, size_t ld, size_t T, size_t D) {
  size_t Tp = pad64(T);
  for (size_t i = 0; i < Tp; i += 2) {
    uint32_t *o = dst + i / 2 * D;
    if (i + 1 < T) {
      const uint16_t *a = src + i * ld, *b = a + ld;
      for (size_t d = 0; d < D; d += 32) {
        __m512i x = _mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)(const void *)(a + d)));
        __m512i y = _mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)(const void *)(b + d)));
        _mm512_storeu_si512(o + d, _mm512_or_si512(x, _mm512_slli_epi32(y, 16)));
        x = _mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)(const void *)(a + d + 16)));
        y = _mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)(const void *)(b + d + 16)));
        _mm512_storeu_si512(o + d + 16, _mm512_or_si512(x, _mm512_slli_epi32(y, 16)));
      }
    } else if (i < T) {
      for (size_t d = 0; d < D; d++) o[d] = src[i * ld + d];
    } else {
      memset(o, 0, D * sizeof *o);
    }
  }
}

void loom__attn_amx_fwd_pack(uint16_t *w, const uint16_t *k, const uint16_t *v, size_t ld,
                             size_t T, size_t D) {
  pairs_of_cols((uint32_t *)(void *)w, k, ld, T, D);
  pairs_of_rows((uint32_t *)(void *)(w + pad64(T) * D), v, ld, T, D);
}

/* 16 bf16 values widened to f32 (exact). */
static inline __m512 widen(const uint16_t *p) {
  __m512i x = _mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)(const void *)p));
  return _mm512_castsi512_ps(_mm512_slli_epi32(x, 16));
}

/* Round 16 f32 lanes to bf16 (nearest even). */
static inline __m256i bf16x16(__m512 x) { return (__m256i)_mm512_cvtneps_pbh(x); }

/* C tiles 0..3 += A (tile 4: 16 rows x 32) times the four B tiles of 16 columns at b, b + 16,
 * b + 32, b + 48 (pairs of rows, bs bytes apart), through B tiles 5, 6, 7, 5. */
static inline void row4(const uint32_t *b, size_t bs) {
  _tile_loadd(5, b, bs);
  _tile_dpbf16ps(0, 4, 5);
  _tile_loadd(6, b + 16, bs);
  _tile_dpbf16ps(1, 4, 6);
  _tile_loadd(7, b + 32, bs);
  _tile_dpbf16ps(2, 4, 7);
  _tile_loadd(5, b + 48, bs);
  _tile_dpbf16ps(3, 4, 5);
}

void loom__attn_amx_fwd_rows(const uint16_t *w, const uint16_t *q, size_t ldi, float *o,
                             size_t ldo, float *lse, size_t T, size_t D, bool causal,
                             float scale, size_t r0, size_t r1) {
  const loom__attn_kernels *kk = loom__attn_kernels_for(LOOM_CPU_AVX512);
  size_t Tp = pad64(T);
  const uint16_t *kd = w, *vv = w + Tp * D;
  float s[16][FB] __attribute__((aligned(64))), t[16][FB] __attribute__((aligned(64)));
  float oacc[16 * 256] __attribute__((aligned(64))); /* D <= 256 */
  uint16_t pb[16][FB] __attribute__((aligned(64))), qpad[16 * 256] __attribute__((aligned(64)));
  float m[16], l[16], alpha[16];
  tiles_on();
  for (size_t i = r0; i < r1; i += 16) {
    size_t nr = r1 - i < 16 ? r1 - i : 16, qs = ldi * 2;
    const uint16_t *qa = q + i * ldi;
    if (nr < 16) { /* the last rows: a zero-padded copy, so the tile reads no further */
      memset(qpad, 0, sizeof qpad);
      for (size_t r = 0; r < nr; r++) memcpy(qpad + r * D, qa + r * ldi, D * 2);
      qa = qpad;
      qs = D * 2;
    }
    for (size_t r = 0; r < 16; r++) {
      m[r] = -INFINITY;
      l[r] = 0;
    }
    memset(oacc, 0, 16 * D * sizeof(float));
    size_t nkmax = causal ? i + nr : T;
    for (size_t j0 = 0; j0 < nkmax; j0 += FB) {
      /* s = q k^T: four 16 x 16 tiles of keys j0.. j0 + 63 */
      _tile_zero(0);
      _tile_zero(1);
      _tile_zero(2);
      _tile_zero(3);
      for (size_t dc = 0; dc < D; dc += 32) {
        _tile_loadd(4, qa + dc, qs);
        row4((const uint32_t *)(const void *)kd + dc / 2 * Tp + j0, Tp * 4);
      }
      _tile_stored(0, &s[0][0], FB * 4);
      _tile_stored(1, &s[0][16], FB * 4);
      _tile_stored(2, &s[0][32], FB * 4);
      _tile_stored(3, &s[0][48], FB * 4);
      /* the online softmax, in f32; p rounded to bf16, zero past each row's keys */
      for (size_t r = 0; r < 16; r++) {
        size_t lim = r < nr ? (causal ? i + r + 1 : T) : 0;
        size_t n = lim <= j0 ? 0 : lim - j0 < FB ? lim - j0 : FB;
        alpha[r] = 1;
        if (n) {
          for (size_t j = 0; j < FB; j += 16)
            _mm512_store_ps(&s[r][j], _mm512_mul_ps(_mm512_load_ps(&s[r][j]), _mm512_set1_ps(scale)));
          float bm = kk->max(s[r], n, m[r]);
          alpha[r] = expf(m[r] - bm); /* 0 on the first block (m = -inf) */
          l[r] = l[r] * alpha[r] + kk->expsum(s[r], s[r], n, bm);
          m[r] = bm;
        }
        for (size_t j = n; j < FB; j++) s[r][j] = 0;
        for (size_t j = 0; j < FB; j += 16)
          _mm256_store_si256((__m256i *)(void *)&pb[r][j], bf16x16(_mm512_load_ps(&s[r][j])));
      }
      /* o = o alpha + p v, 64 columns at a time (the last 32 where D is an odd multiple) */
      for (size_t dc = 0; dc < D; dc += 64) {
        size_t cw = D - dc < 64 ? 32 : 64;
        _tile_zero(0);
        _tile_zero(1);
        _tile_zero(2);
        _tile_zero(3);
        for (size_t ks = 0; ks < FB; ks += 32) {
          const uint32_t *vb = (const uint32_t *)(const void *)vv + (j0 + ks) / 2 * D + dc;
          _tile_loadd(4, &pb[0][ks], FB * 2);
          if (cw == 64) {
            row4(vb, D * 4);
          } else {
            _tile_loadd(5, vb, D * 4);
            _tile_dpbf16ps(0, 4, 5);
            _tile_loadd(6, vb + 16, D * 4);
            _tile_dpbf16ps(1, 4, 6);
          }
        }
        _tile_stored(0, &t[0][0], FB * 4);
        _tile_stored(1, &t[0][16], FB * 4);
        _tile_stored(2, &t[0][32], FB * 4);
        _tile_stored(3, &t[0][48], FB * 4);
        for (size_t r = 0; r < nr; r++) {
          __m512 a = _mm512_set1_ps(alpha[r]);
          float *orow = oacc + r * D + dc;
          for (size_t j = 0; j < cw; j += 16)
            _mm512_store_ps(orow + j, _mm512_fmadd_ps(_mm512_load_ps(orow + j), a,
                                                      _mm512_load_ps(&t[r][j])));
        }
      }
    }
    for (size_t r = 0; r < nr; r++) {
      __m512 inv = _mm512_set1_ps(1.0f / l[r]);
      for (size_t d = 0; d < D; d += 16)
        _mm512_storeu_ps(o + (i + r) * ldo + d, _mm512_mul_ps(_mm512_load_ps(oacc + r * D + d), inv));
      lse[i + r] = m[r] + logf(l[r]);
    }
  }
  _tile_release();
}

/* C tiles 0..3 (rows 0-15 and 16-31 by columns 0-15 and 16-31 of a 32 x 32 block) +=
 * A (tiles 4, 5: 32 rows of a, as rows) times B (tiles 6, 7: two 16-column halves of b). */
#define DP4(a, as, b0, b1, bs)                                                                \
  do {                                                                                        \
    _tile_loadd(4, (a), (as));                                                                \
    _tile_loadd(5, (const char *)(a) + 16 * (size_t)(as), (as));                              \
    _tile_loadd(6, (b0), (bs));                                                               \
    _tile_loadd(7, (b1), (bs));                                                               \
    _tile_dpbf16ps(0, 4, 6);                                                                  \
    _tile_dpbf16ps(1, 4, 7);                                                                  \
    _tile_dpbf16ps(2, 5, 6);                                                                  \
    _tile_dpbf16ps(3, 5, 7);                                                                  \
  } while (0)

/* The 32 x 32 f32 block c (rows cs bytes apart) in or out of tiles 0..3. */
static inline void c_load(float *c, size_t cs) {
  _tile_loadd(0, c, cs);
  _tile_loadd(1, c + 16, cs);
  _tile_loadd(2, (char *)c + 16 * cs, cs);
  _tile_loadd(3, (char *)c + 16 * cs + 64, cs);
}
static inline void c_store(float *c, size_t cs) {
  _tile_stored(0, c, cs);
  _tile_stored(1, c + 16, cs);
  _tile_stored(2, (char *)c + 16 * cs, cs);
  _tile_stored(3, (char *)c + 16 * cs + 64, cs);
}

/* acc rows a0.. a0 + 31 (f32, ld apart) += A [32 rows, 32] bf16 (rows 64 bytes apart) times
 * the pairs b [Tp/2, D] from pair row b0 / 2 on, one 32-column stripe of D at a time; with
 * first, = instead of += (the rows' first contribution: nothing to zero beforehand). */
static void acc_rows(float *acc, size_t ld, size_t a0, const uint16_t *A, const uint32_t *b,
                     size_t b0, size_t D, bool first) {
  for (size_t dc = 0; dc < D; dc += 32) {
    float *c = acc + a0 * ld + dc;
    const uint32_t *bb = b + b0 / 2 * D + dc;
    if (first) {
      _tile_zero(0);
      _tile_zero(1);
      _tile_zero(2);
      _tile_zero(3);
    } else {
      c_load(c, ld * 4);
    }
    DP4(A, 64, bb, bb + 16, D * 4);
    c_store(c, ld * 4);
  }
}

/* out [32, 32] f32 = a (32 rows of D bf16, D apart) times the pairs of columns b ([D/2, Tp],
 * from the block's first key on): a tile of scores (q k^T) or of dO v^T. */
static void scores(float *out, const uint16_t *a, const uint32_t *b, size_t Tp, size_t D) {
  _tile_zero(0);
  _tile_zero(1);
  _tile_zero(2);
  _tile_zero(3);
  for (size_t dc = 0; dc < D; dc += 32)
    DP4(a + dc, D * 2, b + dc / 2 * Tp, b + dc / 2 * Tp + 16, Tp * 4);
  c_store(out, BT * 4);
}

void loom__attn_amx_bwd_slice(void *work, const uint16_t *q, const uint16_t *k,
                              const uint16_t *v, size_t ldi, const uint16_t *o,
                              const float *go, size_t ldo, const float *lse, float *dq,
                              float *dk, float *dv, size_t T, size_t D, bool causal,
                              float scale) {
  const loom__attn_kernels *kk = loom__attn_kernels_for(LOOM_CPU_AVX512);
  size_t Tp = pad64(T), TD = Tp * D;
  uint16_t *qr = work, *gr = qr + TD;              /* q, dO as rows: A of the scores */
  uint32_t *kd = (uint32_t *)(void *)(gr + TD);    /* k, v: pairs of columns (TD / 2 each) */
  uint32_t *vd = kd + TD / 2, *kp = vd + TD / 2;   /* k, q, dO: pairs of rows */
  uint32_t *qp = kp + TD / 2, *gp = qp + TD / 2;
  float *aq = (float *)(void *)(gp + TD / 2), *ak = aq + TD, *av = ak + TD, *di = av + TD;
  float s[BT][BT] __attribute__((aligned(64))), g[BT][BT] __attribute__((aligned(64)));
  uint16_t ds[BT][BT] __attribute__((aligned(64))), dst[BT][BT] __attribute__((aligned(64)));
  uint16_t pt[BT][BT] __attribute__((aligned(64)));
  rows_bf16(qr, q, ldi, T, D);
  rows_f32(gr, go, ldo, T, D);
  pairs_of_cols(kd, k, ldi, T, D);
  pairs_of_cols(vd, v, ldi, T, D);
  pairs_of_rows(kp, k, ldi, T, D);
  pairs_of_rows(qp, qr, D, T, D);
  pairs_of_rows(gp, gr, D, T, D);
  size_t la = D; /* the gradients' rows: in the work area, copied out at the end where T is
                    not a multiple of 32 (a tile's rows would pass the tensor's end), else the
                    outputs themselves */
  if (T % BT == 0) {
    aq = dq;
    ak = dk;
    av = dv;
    la = ldi;
  }
  for (size_t i = 0; i < Tp; i++) { /* Di = dO . O in f32 from dO rounded as dO v^T takes it,
                                        so that the two cancel where they should (zero on the
                                        padding rows) */
    __m512 a = _mm512_setzero_ps();
    for (size_t d = 0; i < T && d < D; d += 16)
      a = _mm512_fmadd_ps(widen(gr + i * D + d), widen(o + i * ldo + d), a);
    di[i] = _mm512_reduce_add_ps(a);
  }
  tiles_on();
  for (size_t i0 = 0; i0 < T; i0 += BT) {
    size_t jend = causal ? (i0 + BT < T ? i0 + BT : T) : T;
    for (size_t j0 = 0; j0 < jend; j0 += BT) {
      /* s = q k^T and g = dO v^T for the 32 x 32 tile */
      scores(&s[0][0], qr + i0 * D, kd + j0, Tp, D);
      scores(&g[0][0], gr + i0 * D, vd + j0, Tp, D);
      /* p = exp(s scale - lse), ds = p (g - Di) scale, zero where a row does not see a key
       * (or is padding); ds as rows, p and ds transposed, all rounded to bf16 */
      __m512 sc = _mm512_set1_ps(scale);
      for (size_t r = 0; r < BT; r++) {
        size_t i = i0 + r, lim = i >= T ? 0 : causal ? i + 1 : T;
        size_t n = lim <= j0 ? 0 : lim - j0 < BT ? lim - j0 : BT;
        for (size_t j = 0; j < BT; j += 16)
          _mm512_store_ps(&s[r][j], _mm512_mul_ps(_mm512_load_ps(&s[r][j]), sc));
        kk->expsum(s[r], s[r], n, i < T ? lse[i] : 0);
        for (size_t j = n; j < BT; j++) s[r][j] = 0;
        __m512 d = _mm512_set1_ps(di[i]);
        for (size_t j = 0; j < BT; j += 16) {
          __m512 p = _mm512_load_ps(&s[r][j]);
          __m512 x = _mm512_mul_ps(_mm512_mul_ps(p, _mm512_sub_ps(_mm512_load_ps(&g[r][j]), d)), sc);
          _mm512_store_ps(&g[r][j], x);
          _mm256_store_si256((__m256i *)(void *)&ds[r][j], bf16x16(x));
          _mm256_store_si256((__m256i *)(void *)&pt[r][j], bf16x16(p)); /* p as rows, for now */
        }
      }
      for (size_t r = 0; r < BT; r++) /* transposes of the bf16 blocks */
        for (size_t c = r + 1; c < BT; c++) {
          uint16_t x = pt[r][c];
          pt[r][c] = pt[c][r];
          pt[c][r] = x;
          dst[r][c] = ds[c][r];
          dst[c][r] = ds[r][c];
        }
      for (size_t r = 0; r < BT; r++) dst[r][r] = ds[r][r];
      bool kfirst = i0 == (causal ? j0 : 0); /* the first tile to see keys j0.. */
      acc_rows(aq, la, i0, &ds[0][0], kp, j0, D, j0 == 0); /* dq += ds k */
      acc_rows(ak, la, j0, &dst[0][0], qp, i0, D, kfirst);  /* dk += ds^T q */
      acc_rows(av, la, j0, &pt[0][0], gp, i0, D, kfirst);   /* dv += p^T dO */
    }
  }
  _tile_release();
  for (size_t i = 0; i < T && aq != dq; i++) {
    memcpy(dq + i * ldi, aq + i * D, D * sizeof(float));
    memcpy(dk + i * ldi, ak + i * D, D * sizeof(float));
    memcpy(dv + i * ldi, av + i * D, D * sizeof(float));
  }
}
