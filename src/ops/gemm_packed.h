/* gemm_packed.h: the driver of loom's own packed GEMMs for 16-bit operands (gemm_avx2.c,
 * gemm_avx512.c): the BLIS / OpenBLAS loops around a micro-kernel, written once. Private to
 * the ops layer; included once, by a file built for its instruction set.
 *
 * The including file defines, before it: MR, NR (the micro-kernel's tile of C), KC (k per
 * packed A block at most), MC (rows per packed A block, a multiple of MR), NC (columns per B
 * block at most), BBLOCK_C16 and BBLOCK_F32 (a packed B block's most f32 elements for a 16-bit
 * and an f32 C), KB32 (an f32 C's B block's fewest rows); and, after it, the four functions declared below, in its own vectors. Then
 * gemm_packed(g, who) is loom__gemm's contract (gemm.h) for that file's kernel.
 *
 * The loops: C is cut in NC-wide column blocks; for each, op(B)'s rows kb at a time are packed
 * (widened to f32) into slivers of NR columns, k-major, shared by the threads; each MC-row
 * block of op(A) is packed, KC columns at a time, into slivers of MR rows, k-major, per thread;
 * each (B sliver, A sliver) pair is one micro-kernel call and one epilogue. A 16-bit C takes
 * all of K in one B block; when K spans several KC pieces its partial sums wait in an f32
 * block per thread (MC x nc, L2) and C is rounded once, after the last. An f32 C accumulates
 * the B blocks' sums in place. MC-row blocks run on the caller's OpenMP team
 * (loom__gemm_threads). Errors: loom__gemm_check's, and LOOM_ENOMEM for the packing buffers
 * (compute pool, freed before it returns; a dry run allocates them and computes nothing). */
#ifndef LOOM_OPS_GEMM_PACKED_H
#define LOOM_OPS_GEMM_PACKED_H

#include "ops/gemm_int.h"

#include <immintrin.h>
#ifdef _OPENMP
#include <omp.h>
#endif

/* An operand as the product sees it: element (r, c) of op(X) is X[r * rs + c * cs]. */
typedef struct opnd {
  const void *p;
  loom_dtype dt;
  int64_t rs, cs;
} opnd;

/* Where a tile's values go: out = alpha t (+ prev) (+ bias), m x n of it. prev (NULL: none)
 * and out are row-major with their own row strides and dtypes. */
typedef struct tile_io {
  const void *prev;
  loom_dtype prev_dt;
  int64_t ldp;
  void *out;
  loom_dtype out_dt;
  int64_t ldo;
  const float *bias; /* at the tile's first column, or NULL */
  float alpha;
} tile_io;

/* op(B)[k0, k0 + kb) x [j0, j0 + nc), slivers [s0, s1) of NR columns: sliver s holds, for each
 * k, the NR values of columns j0 + NR s .. (zeros past nc), at dst + s * kb * NR (64-byte
 * aligned). */
static void pack_b(const opnd *b, int64_t k0, int64_t kb, int64_t j0, int64_t nc, int64_t s0,
                   int64_t s1, float *dst);
/* op(A)[i0, i0 + mc) x [k0, k0 + kc) into slivers of MR rows: sliver s holds, for each k, the
 * MR values of rows i0 + MR s .. (zeros past mc), at dst + s * kc * MR; m_total: op(A)'s rows.
 * dst has room for MC + MR rows and 8 floats more. */
static void pack_a(const opnd *a, int64_t i0, int64_t mc, int64_t k0, int64_t kc, float *dst,
                   int64_t m_total);
/* t[MR][NR] (64-byte aligned) = sum over kc of a[k][0..MR) (x) b[k][0..NR). */
static inline void micro_kernel(int64_t kc, const float *a, const float *b, float *t);
/* io's out = alpha t (+ prev) (+ bias) for the tile's first m rows and n columns. */
static void epilogue(const float *t, int64_t m, int64_t n, const tile_io *io);

/* One product (batch element). */
typedef struct prod {
  const loom__gemm_args *g;
  opnd a, b;
  void *C;
  int64_t nc, kb;      /* B block: kb rows of op(B) x nc columns */
  float *bp;           /* packed B block (kb * nc rounded up to NR floats) */
  float *ap, *acc;     /* per thread: packed A block, partial sums (MC * nc) */
  int64_t ap_n, acc_n; /* floats per thread of each */
} prod;

/* A product's element size, inline: the operands and C are f32 or 16-bit (loom__gemm_check),
 * and this runs per tile and per prefetched row, where a call into core cost ~0.8% of a
 * capped bf16 GPT step. */
static inline size_t esize(loom_dtype dt) { return dt == LOOM_F32 ? 4 : 2; }

static inline void *elem(void *p, loom_dtype dt, int64_t i) {
  return (char *)p + (size_t)i * esize(dt);
}

/* C's MC-row block at row i0, columns [j0, j0 + nc), B block rows [k0, k0 + kb) packed in bp.
 * first / last: whether k0 is 0 / k0 + kb is K. */
static void row_block(const prod *p, int tid, int64_t i0, int64_t j0, int64_t nc, int64_t k0,
                      bool first, bool last) {
  const loom__gemm_args *g = p->g;
  int64_t mc = g->M - i0 < MC ? g->M - i0 : MC, kb = p->kb < g->K - k0 ? p->kb : g->K - k0;
  float *ap = p->ap + tid * p->ap_n, *acc = p->acc ? p->acc + tid * p->acc_n : NULL;
  _Alignas(64) float t[MR * NR];
  int64_t pieces = (kb + KC - 1) / KC, step = (kb + pieces - 1) / pieces;
  for (int64_t kk = 0; kk < kb; kk += step) {
    int64_t kc = kb - kk < step ? kb - kk : step;
    pack_a(&p->a, i0, mc, k0 + kk, kc, ap, g->M);
    /* the block's first and last pieces: C is read (beta, or an earlier B block's partial
     * sums) before the first and written after the last; between them the partial sums stay
     * in acc (L2) */
    bool f = kk == 0, l = kk + kc == kb;
    for (int64_t s = 0; s * NR < nc; s++) {
      int64_t j = j0 + s * NR, n = nc - s * NR < NR ? nc - s * NR : NR;
      const float *bs = p->bp + s * kb * NR + kk * NR;
      for (int64_t q = 0; q * MR < mc; q++) {
        int64_t i = i0 + q * MR, m = mc - q * MR < MR ? mc - q * MR : MR;
        tile_io io = {.alpha = g->alpha};
        void *cij = elem(p->C, g->c_dtype, i * g->ldc + j);
        float *aij = acc ? acc + (i - i0) * nc + (j - j0) : NULL;
        if (!f) {
          io.prev = aij, io.prev_dt = LOOM_F32, io.ldp = nc;
        } else if (!first) { /* an f32 C holding the earlier B blocks' sums */
          io.prev = cij, io.prev_dt = LOOM_F32, io.ldp = g->ldc;
        } else {
          if (g->beta != 0.0f) io.prev = cij, io.prev_dt = g->c_dtype, io.ldp = g->ldc;
          if (g->bias) io.bias = g->bias + j;
        }
        if (l) io.out = cij, io.out_dt = last ? g->c_dtype : LOOM_F32, io.ldo = g->ldc;
        else io.out = aij, io.out_dt = LOOM_F32, io.ldo = nc;
        if (io.prev) /* the tile's rows of prev into L1 while the kernel runs */
          for (int64_t r = 0; r < m; r++) {
            const char *pr = elem((void *)io.prev, io.prev_dt, r * io.ldp);
            _mm_prefetch(pr, _MM_HINT_T0);
            _mm_prefetch(pr + NR * esize(io.prev_dt) - 1, _MM_HINT_T0);
          }
        micro_kernel(kc, ap + q * kc * MR, bs, t);
        epilogue(t, m, n, &io);
      }
    }
  }
}

static void run_prod(prod *p, int nthr) {
  const loom__gemm_args *g = p->g;
#pragma omp parallel num_threads(nthr) if (nthr > 1)
  {
    int tid = 0, nt = 1; /* the team may be smaller than asked */
#ifdef _OPENMP
    tid = omp_get_thread_num(), nt = omp_get_num_threads();
#endif
    for (int64_t j0 = 0; j0 < g->N; j0 += p->nc) {
      int64_t nc = g->N - j0 < p->nc ? g->N - j0 : p->nc;
      for (int64_t k0 = 0; k0 < g->K; k0 += p->kb) {
        int64_t kb = g->K - k0 < p->kb ? g->K - k0 : p->kb, ns = (nc + NR - 1) / NR;
        int64_t per = (ns + nt - 1) / nt, s0 = tid * per < ns ? tid * per : ns;
        pack_b(&p->b, k0, kb, j0, nc, s0, s0 + per < ns ? s0 + per : ns, p->bp);
#pragma omp barrier /* every sliver packed before any row block reads it */
#pragma omp for schedule(dynamic, 1)
        for (int64_t i0 = 0; i0 < g->M; i0 += MC)
          row_block(p, tid, i0, j0, nc, k0, k0 == 0, k0 + kb == g->K);
      }
    }
  }
}

static int gemm_packed(const loom__gemm_args *g, const char *who) {
  int rc = loom__gemm_check(g, who);
  if (rc != LOOM_OK) return rc;
  int nthr = loom__gemm_threads();
  if (nthr < 1) nthr = 1;
  prod p = {.g = g};
  /* B block: a 16-bit C takes all of K in one block (its partial sums stay in acc, L2);
   * an f32 C accumulates in place, so its block is as wide as N allows */
  p.nc = g->N < NC ? g->N : NC;
  if (g->c_dtype == LOOM_F32) {
    int64_t kb = BBLOCK_F32 / ((p.nc + NR - 1) / NR * NR);
    p.kb = kb < KB32 ? KB32 : kb;
  } else {
    int64_t nc = BBLOCK_C16 / g->K / NR * NR;
    if (nc < NR) nc = NR;
    if (nc < p.nc) p.nc = nc;
    p.kb = g->K;
  }
  if (p.kb > g->K) p.kb = g->K;
  int64_t ncr = (p.nc + NR - 1) / NR * NR;
  p.ap_n = (MC + MR) * KC + 16; /* a multiple of 16: every thread's block 64-byte aligned */
  p.acc_n = p.kb > KC ? MC * p.nc : 0;
  size_t nb = (size_t)(p.kb * ncr) * sizeof(float);
  size_t na = (size_t)(nthr * p.ap_n) * sizeof(float), nacc = (size_t)(nthr * p.acc_n) * 4;
  LOOM__GEMM_ALLOC(p.bp, nb, who, "the packed B block");
  LOOM__GEMM_ALLOC(p.ap, na, who, "the packed A blocks");
  if (nacc) LOOM__GEMM_ALLOC(p.acc, nacc, who, "the partial sums");
  if (loom__dry()) goto done; /* a dry run: the buffers counted, nothing computed */
  for (int64_t q = 0; q < g->batch; q++) {
    p.a = (opnd){.p = elem((void *)g->A, g->ab_dtype, q * g->stride_a), .dt = g->ab_dtype,
                 .rs = g->trans_a ? 1 : g->lda, .cs = g->trans_a ? g->lda : 1};
    p.b = (opnd){.p = elem((void *)g->B, g->ab_dtype, q * g->stride_b), .dt = g->ab_dtype,
                 .rs = g->trans_b ? 1 : g->ldb, .cs = g->trans_b ? g->ldb : 1};
    p.C = elem(g->C, g->c_dtype, q * g->stride_c);
    run_prod(&p, nthr);
  }
done:
  loom__free(p.bp);
  loom__free(p.ap);
  loom__free(p.acc);
  return rc;
}

#endif
