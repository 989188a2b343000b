/* attn_fused.c: the fused attention recurrence that attention.c's ops run (flash attention).
 * Forward walks query rows, four at a time (one register tile), over blocks of BLOCK keys with
 * an online softmax (running max m and sum l, the output rescaled when m grows), so no more
 * than one block of a row of the score matrix exists at a time; it saves only the output and
 * each row's logsumexp. Backward (FlashAttention-2) recomputes the scores tile by tile (QTILE
 * query rows by BLOCK keys) from q, k and the logsumexp: p = exp(s - lse), dp = dO . v,
 * ds = p (dp - Di) with Di = dO . O, then dq += ds k, dk += ds^T q, dv += p^T dO (ds scaled by
 * 1/sqrt(D)). Scores come from k transposed ([D, T] per slice, the scale folded in), so that
 * every product is an accum kernel (accum4: four output rows a pass). All in f32; the inner
 * loops are the per-level kernels of attn_int.h. (batch, head) slices (and, in forward, bands
 * of query rows) run on the caller's OpenMP team (loom_set_num_threads). bf16 inputs whose head
 * width fits run on AMX tiles instead (attn_amx.c's kernels, driven from here). */
#include "ops/attn_fused.h"
#include "ops/gemm.h"
#include "ops/ops_int.h"

#include <math.h>
#ifdef _OPENMP
#include <omp.h>
#endif

/* Keys per block: a block of scores (and of dp in backward) is this many floats. */
enum {
  BLOCK = 64, /* keys a block */
  BAND = 32,  /* query rows a forward work item */
  QTILE = 32  /* query rows a backward tile */
};

static int64_t in_off(const attn_dims *a, int64_t bh) {
  return bh / a->H * a->T * a->ldi + bh % a->H * a->D;
}
static int64_t out_off(const attn_dims *a, int64_t bh) {
  return bh / a->H * a->T * a->ldo + bh % a->H * a->D;
}

/* kt[bh] = scale * k[bh]^T: each (batch, head) slice's [T, D] rows as [D, ldt], so that a block
 * of scores is an accum (the score row in registers, kt's rows streaming by) rather than one
 * dot product, each ending in a horizontal sum, per key. */
static void transpose_scaled(const attn_dims *a, const float *k, float *kt, float scale) {
  const loom__attn_kernels *kk = loom__attn_k();
#pragma omp parallel for num_threads(loom__gemm_threads()) if (a->BH > 1)
  for (int64_t bh = 0; bh < a->BH; bh++)
    kk->transpose(kt + bh * a->D * a->ldt, (size_t)a->ldt, k + in_off(a, bh), (size_t)a->ldi,
                  (size_t)a->T, (size_t)a->D, scale);
}

/* o[r] += sum_j p[r][j * ps] * v_j for r < c (c <= 4), j < n: a tile of four rows where there
 * are four, else pairs and a single row (their weights gathered first where ps is not 1: n is
 * then at most QTILE). */
static void accum_rows(const loom__attn_kernels *kk, float *const *o, const float *const *p,
                       size_t ps, size_t c, const float *v, size_t ld, size_t n, size_t D) {
  if (c == 4) {
    kk->accum4(o, p, ps, v, ld, n, D);
    return;
  }
  float g[3][QTILE];
  const float *pr[3];
  for (size_t r = 0; r < c; r++) {
    pr[r] = p[r];
    if (ps != 1) {
      for (size_t j = 0; j < n; j++) g[r][j] = p[r][j * ps];
      pr[r] = g[r];
    }
  }
  size_t r = 0;
  for (; r + 2 <= c; r += 2) kk->accum2(o[r], o[r + 1], pr[r], pr[r + 1], v, ld, n, D);
  if (r < c) kk->accum(o[r], pr[r], v, ld, n, D);
}

/* s[r][0..w) = x[r] . t's columns j0..j0+w for r < c (t: k or v transposed, [D, ldt]): the
 * scores of up to four rows against a block, from one pass over t's block. */
static void tile_scores(const loom__attn_kernels *kk, const attn_dims *a, float *const *s,
                        const float *const *x, size_t c, const float *t, int64_t j0, size_t w) {
  for (size_t r = 0; r < c; r++)
    for (size_t j = 0; j < w; j++) s[r][j] = 0;
  accum_rows(kk, s, x, 1, c, t + j0, (size_t)a->ldt, (size_t)a->D, w);
}

/* Rows [r0, r1) of one (batch, head) slice: q, v (rows ldi apart), o (ldo apart) are its
 * [T, D] rows, kt its scaled [D, T] keys, lse its [T]. Four rows at a time: a block's scores
 * are computed for all its keys (w), those past each row's causal limit then left out (and
 * zero in p, so that the four rows share one pass over the block's values). */
void loom__attn_fwd_rows(const loom__attn_kernels *kk, const attn_dims *a, const float *q,
                     const float *kt, const float *v, float *o, float *lse, int64_t r0,
                     int64_t r1) {
  const size_t D = (size_t)a->D;
  float s[4][BLOCK], m[4], l[4];
  for (int64_t i = r0; i < r1; i += 4) {
    size_t c = (size_t)(r1 - i < 4 ? r1 - i : 4);
    float *oi[4], *sr[4];
    const float *qi[4];
    int64_t nk[4], nkmax = 0;
    for (size_t r = 0; r < c; r++) {
      qi[r] = q + (i + (int64_t)r) * a->ldi;
      oi[r] = o + (i + (int64_t)r) * a->ldo;
      sr[r] = s[r];
      m[r] = -INFINITY;
      l[r] = 0;
      nk[r] = a->causal ? i + (int64_t)r + 1 : a->T;
      nkmax = nk[r] > nkmax ? nk[r] : nkmax;
      for (size_t d = 0; d < D; d++) oi[r][d] = 0;
    }
    for (int64_t j0 = 0; j0 < nkmax; j0 += BLOCK) {
      size_t nmax = (size_t)(nkmax - j0 < BLOCK ? nkmax - j0 : BLOCK);
      tile_scores(kk, a, sr, qi, c, kt, j0, (size_t)(a->T - j0 < BLOCK ? a->T - j0 : BLOCK));
      for (size_t r = 0; r < c; r++) {
        int64_t left = nk[r] - j0;
        size_t n = (size_t)(left <= 0 ? 0 : left < BLOCK ? left : BLOCK);
        if (n) {
          float bm = kk->max(s[r], n, m[r]);
          float alpha = expf(m[r] - bm); /* 0 on the first block (m = -inf) */
          float sum = kk->expsum(s[r], s[r], n, bm);
          if (alpha != 1.0f)
            for (size_t d = 0; d < D; d++) oi[r][d] *= alpha;
          l[r] = l[r] * alpha + sum;
          m[r] = bm;
        }
        for (size_t j = n; j < nmax; j++) s[r][j] = 0;
      }
      accum_rows(kk, oi, (const float *const *)sr, 1, c, v + j0 * a->ldi, (size_t)a->ldi, nmax, D);
    }
    for (size_t r = 0; r < c; r++) {
      float inv = 1.0f / l[r];
      for (size_t d = 0; d < D; d++) oi[r][d] *= inv;
      lse[i + (int64_t)r] = m[r] + logf(l[r]);
    }
  }
}

void loom__attn_fwd(const attn_dims *a, const float *q, float *kt, const float *k,
                     const float *v, float *o, float *lse) {
  const loom__attn_kernels *kk = loom__attn_k();
  int64_t bands = (a->T + BAND - 1) / BAND, items = a->BH * bands, tsz = a->D * a->ldt;
  transpose_scaled(a, k, kt, a->scale);
#pragma omp parallel for schedule(dynamic, 1) num_threads(loom__gemm_threads()) if (items > 1)
  for (int64_t it = 0; it < items; it++) {
    int64_t bh = it / bands, r0 = it % bands * BAND, r1 = r0 + BAND < a->T ? r0 + BAND : a->T;
    loom__attn_fwd_rows(kk, a, q + in_off(a, bh), kt + bh * tsz, v + in_off(a, bh), o + out_off(a, bh),
             lse + bh * a->T, r0, r1);
  }
}

/* One (batch, head) slice's gradients: dq, dk, dv ([T, D], zeroed) from dO, O and lse, a tile
 * of QTILE query rows by BLOCK keys at a time. The tile's p and ds are kept as rows, zero where
 * a row does not see a key, so that every product is an accum over four outputs at a time
 * (accum4): dq += ds k over rows of ds, dk += ds^T q and dv += p^T dO over its columns (the
 * weights BLOCK apart): four output rows held in registers while the tile's rows stream by
 * once, instead of a read-modify-write of each dk and dv row for every query row. */
void loom__attn_bwd_slice(const loom__attn_kernels *kk, const attn_dims *a, const float *q,
                      const float *k, const float *kt, const float *vt, const float *o,
                      const float *lse, const float *go, float *dq, float *dk, float *dv) {
  const size_t D = (size_t)a->D, li = (size_t)a->ldi, lo = (size_t)a->ldo;
  float pr[QTILE][BLOCK], dsr[QTILE][BLOCK], dp[4][BLOCK], di[QTILE];
  size_t nr[QTILE]; /* keys row r of the tile sees */
  for (int64_t i0 = 0; i0 < a->T; i0 += QTILE) {
    size_t ni = (size_t)(a->T - i0 < QTILE ? a->T - i0 : QTILE);
    const float *qt = q + i0 * a->ldi, *got = go + i0 * a->ldo; /* the tile's rows */
    for (size_t r = 0; r < ni; r++) di[r] = kk->dot(got + r * lo, o + (i0 + (int64_t)r) * a->ldo, D);
    int64_t jend = a->causal ? i0 + (int64_t)ni : a->T;
    for (int64_t j0 = 0; j0 < jend; j0 += BLOCK) {
      size_t nj = (size_t)(jend - j0 < BLOCK ? jend - j0 : BLOCK);
      size_t w = (size_t)(a->T - j0 < BLOCK ? a->T - j0 : BLOCK);
      for (size_t r = 0; r < ni; r += 4) {
        size_t c = ni - r < 4 ? ni - r : 4;
        float *sr[4], *gr[4];
        const float *xq[4], *xg[4];
        for (size_t u = 0; u < c; u++) {
          sr[u] = pr[r + u];
          gr[u] = dp[u];
          xq[u] = qt + (r + u) * li;
          xg[u] = got + (r + u) * lo;
        }
        tile_scores(kk, a, sr, xq, c, kt, j0, w);
        tile_scores(kk, a, gr, xg, c, vt, j0, w);
        for (size_t u = r; u < r + c; u++) {
          int64_t see = a->causal ? i0 + (int64_t)u - j0 + 1 : (int64_t)nj;
          size_t n = nr[u] = see < 0 ? 0 : see > (int64_t)nj ? nj : (size_t)see, j;
          float *p = pr[u], *ds = dsr[u], *g = dp[u - r], dd = di[u], sc = a->scale;
          kk->expsum(p, p, n, lse[i0 + (int64_t)u]);
          for (j = 0; j < n; j++) ds[j] = p[j] * (g[j] - dd) * sc;
          for (; j < nj; j++) p[j] = ds[j] = 0;
        }
      }
      const float *kb = k + j0 * a->ldi;
      for (size_t r = 0; r < ni; r += 4) {
        size_t c = ni - r < 4 ? ni - r : 4, n = 0;
        float *dqr[4];
        const float *ds[4];
        for (size_t u = 0; u < c; u++) {
          dqr[u] = dq + (i0 + (int64_t)(r + u)) * a->ldi;
          ds[u] = dsr[r + u];
          n = nr[r + u] > n ? nr[r + u] : n;
        }
        accum_rows(kk, dqr, ds, 1, c, kb, li, n, D);
      }
      for (size_t j = 0; j < nj; j += 4) { /* rows from the first that sees key j0 + j */
        int64_t first = a->causal ? j0 + (int64_t)j - i0 : 0;
        size_t r0 = first < 0 ? 0 : (size_t)first, c = nj - j < 4 ? nj - j : 4;
        if (r0 >= ni) break; /* later keys are seen later still */
        float *dvj[4], *dkj[4];
        const float *pc[4], *dc[4];
        for (size_t u = 0; u < c; u++) {
          dvj[u] = dv + (j0 + (int64_t)(j + u)) * a->ldi;
          dkj[u] = dk + (j0 + (int64_t)(j + u)) * a->ldi;
          pc[u] = &pr[r0][j + u];
          dc[u] = &dsr[r0][j + u];
        }
        accum_rows(kk, dvj, pc, BLOCK, c, got + r0 * lo, lo, ni - r0, D);
        accum_rows(kk, dkj, dc, BLOCK, c, qt + r0 * li, li, ni - r0, D);
      }
    }
  }
}

void loom__attn_bwd(const attn_dims *a, const float *q, const float *k, const float *v,
                     float *kt, float *vt, const float *o, const float *lse, const float *go,
                     float *dq, float *dk, float *dv) {
  const loom__attn_kernels *kk = loom__attn_k();
  int64_t tsz = a->D * a->ldt;
  transpose_scaled(a, k, kt, a->scale);
  transpose_scaled(a, v, vt, 1.0f);
#pragma omp parallel for schedule(dynamic, 1) num_threads(loom__gemm_threads()) if (a->BH > 1)
  for (int64_t bh = 0; bh < a->BH; bh++) {
    int64_t i = in_off(a, bh), u = out_off(a, bh);
    loom__attn_bwd_slice(kk, a, q + i, k + i, kt + bh * tsz, vt + bh * tsz, o + u, lse + bh * a->T, go + u,
              dq + i, dk + i, dv + i);
  }
}

/* ---- bf16 on AMX tiles (attn_amx.c) -------------------------------------------------------- */

static _Atomic bool amx_off; /* tests: loom__attn_set_amx(false) */

void loom__attn_set_amx(bool on) { amx_off = !on; }

bool loom__attn_amx_fits(int64_t D) {
  return !amx_off && D > 0 && D % 32 == 0 && D <= 256 && loom__cpu_amx_bf16();
}

/* Whether this op's products run on AMX: bf16 inputs and a head width that fits. */
bool loom__attn_use_amx(const attn_dims *a, loom_dtype dt) {
  return dt == LOOM_BF16 && a->T > 0 && loom__attn_amx_fits(a->D);
}

/* Forward on AMX: each slice's k and v packed into w ([BH, fwd_elems] bf16), then bands of
 * query rows as attn_fwd walks them. q, k, v: bf16 slices as attn_dims says; o f32. */
void loom__attn_amx_run_fwd(const attn_dims *a, const uint16_t *q, const uint16_t *k, const uint16_t *v,
                    uint16_t *w, float *o, float *lse) {
  size_t T = (size_t)a->T, D = (size_t)a->D, we = loom__attn_amx_fwd_elems(T, D);
  int64_t bands = (a->T + BAND - 1) / BAND, items = a->BH * bands;
#pragma omp parallel for num_threads(loom__gemm_threads()) if (a->BH > 1)
  for (int64_t bh = 0; bh < a->BH; bh++)
    loom__attn_amx_fwd_pack(w + bh * we, k + in_off(a, bh), v + in_off(a, bh), (size_t)a->ldi,
                            T, D);
#pragma omp parallel for schedule(dynamic, 1) num_threads(loom__gemm_threads()) if (items > 1)
  for (int64_t it = 0; it < items; it++) {
    int64_t bh = it / bands, r0 = it % bands * BAND, r1 = r0 + BAND < a->T ? r0 + BAND : a->T;
    loom__attn_amx_fwd_rows(w + bh * we, q + in_off(a, bh), (size_t)a->ldi, o + out_off(a, bh),
                            (size_t)a->ldo, lse + bh * a->T, T, D, a->causal, a->scale,
                            (size_t)r0, (size_t)r1);
  }
}

/* A work tensor for AMX: the forward's packed k and v, or one backward work area per thread. */
int loom__attn_amx_work_new(const attn_dims *a, bool backward, loom_tensor **out) {
  size_t T = (size_t)a->T, D = (size_t)a->D;
  int64_t shape[2] = {backward ? loom__gemm_threads() : a->BH,
                      (int64_t)(backward ? (loom__attn_amx_bwd_bytes(T, D) + 63) / 64 * 32
                                         : loom__attn_amx_fwd_elems(T, D))};
  return loom_tensor_empty(LOOM_BF16, 2, shape, out);
}

/* Backward on AMX: the slices dealt out to the threads in turn (slice bh to worker bh mod n),
 * each worker with its own work area. q, k, v, o: bf16; go, lse, dq, dk, dv: f32. */
void loom__attn_amx_run_bwd(const attn_dims *a, const uint16_t *q, const uint16_t *k, const uint16_t *v,
                    const uint16_t *o, const float *go, const float *lse, float *dq, float *dk,
                    float *dv, loom_tensor *work) {
  int64_t n = work->shape[0], per = work->shape[1];
  uint16_t *w = loom_tensor_data(work);
#pragma omp parallel for schedule(static, 1) num_threads(loom__gemm_threads()) if (n > 1)
  for (int64_t t = 0; t < n; t++)
    for (int64_t bh = t; bh < a->BH; bh += n) {
      int64_t i = in_off(a, bh), u = out_off(a, bh);
      loom__attn_amx_bwd_slice(w + t * per, q + i, k + i, v + i, (size_t)a->ldi, o + u, go + u,
                               (size_t)a->ldo, lse + bh * a->T, dq + i, dk + i, dv + i,
                               (size_t)a->T, (size_t)a->D, a->causal, a->scale);
    }
}

