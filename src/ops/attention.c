/* attention.c: scaled dot-product attention (PyTorch's F.scaled_dot_product_attention with
 * is_causal), fused: the flash-attention recurrence. Forward walks query rows, four at a time
 * (one register tile), over blocks of BLOCK keys with an online softmax (running max m and sum l, the output rescaled when m
 * grows), so no more than one block of a row of the score matrix exists at a time; it saves
 * only the output and each row's logsumexp. Backward (FlashAttention-2) recomputes the scores
 * tile by tile (QTILE query rows by BLOCK keys) from q, k and the logsumexp: p = exp(s - lse),
 * dp = dO . v, ds = p (dp - Di) with Di = dO . O, then dq += ds k, dk += ds^T q, dv += p^T dO
 * (ds scaled by 1/sqrt(D)). Scores come from k transposed ([D, T] per slice, the scale folded
 * in), so that every product is an accum kernel (accum4: four output rows a pass). All in f32; f16 / bf16 inputs are staged to
 * f32 (loom_sdpa_qkv's a batch element at a time, per thread) and the output rounded once. The inner loops are the per-level kernels of attn_int.h.
 * (batch, head) slices (and, in forward, bands of query rows) run on the caller's OpenMP team
 * (loom_set_num_threads). The same kernels serve loom_sdpa_qkv, which reads q, k and v in
 * place from one [B, T, 3C] tensor (GPT-2's c_attn output) and writes [B, T, C], so that a
 * GPT's attention neither copies heads apart and together nor sums three sliced gradients. */
#include "ops/attn_int.h"
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

typedef struct attn_dims {
  int64_t BH, T, D;
  int64_t ldt; /* row length of k and v transposed ([D, T] per slice): T padded, so that rows
                  a power of two apart in bytes do not all map to the same cache sets */
  bool causal;
  float scale;
  /* Where the rows are: slice bh = (b, h) of q, k, v and their gradients starts at
   * b * T * ldi + h * D and its rows are ldi floats apart; of the output and its gradient at
   * b * T * ldo + h * D, ldo apart. [B, H, T, D] contiguous: H 1 (b = bh), ldi = ldo = D;
   * packed ([B, T, 3C] in, [B, T, C] out, loom_sdpa_qkv): H heads, ldi 3C, ldo C. */
  int64_t H, ldi, ldo;
} attn_dims;

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
static void fwd_rows(const loom__attn_kernels *kk, const attn_dims *a, const float *q,
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

static void attn_fwd(const attn_dims *a, const float *q, float *kt, const float *k,
                     const float *v, float *o, float *lse) {
  const loom__attn_kernels *kk = loom__attn_k();
  int64_t bands = (a->T + BAND - 1) / BAND, items = a->BH * bands, tsz = a->D * a->ldt;
  transpose_scaled(a, k, kt, a->scale);
#pragma omp parallel for schedule(dynamic, 1) num_threads(loom__gemm_threads()) if (items > 1)
  for (int64_t it = 0; it < items; it++) {
    int64_t bh = it / bands, r0 = it % bands * BAND, r1 = r0 + BAND < a->T ? r0 + BAND : a->T;
    fwd_rows(kk, a, q + in_off(a, bh), kt + bh * tsz, v + in_off(a, bh), o + out_off(a, bh),
             lse + bh * a->T, r0, r1);
  }
}

/* One (batch, head) slice's gradients: dq, dk, dv ([T, D], zeroed) from dO, O and lse, a tile
 * of QTILE query rows by BLOCK keys at a time. The tile's p and ds are kept as rows, zero where
 * a row does not see a key, so that every product is an accum over four outputs at a time
 * (accum4): dq += ds k over rows of ds, dk += ds^T q and dv += p^T dO over its columns (the
 * weights BLOCK apart): four output rows held in registers while the tile's rows stream by
 * once, instead of a read-modify-write of each dk and dv row for every query row. */
static void bwd_slice(const loom__attn_kernels *kk, const attn_dims *a, const float *q,
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

static void attn_bwd(const attn_dims *a, const float *q, const float *k, const float *v,
                     float *kt, float *vt, const float *o, const float *lse, const float *go,
                     float *dq, float *dk, float *dv) {
  const loom__attn_kernels *kk = loom__attn_k();
  int64_t tsz = a->D * a->ldt;
  transpose_scaled(a, k, kt, a->scale);
  transpose_scaled(a, v, vt, 1.0f);
#pragma omp parallel for schedule(dynamic, 1) num_threads(loom__gemm_threads()) if (a->BH > 1)
  for (int64_t bh = 0; bh < a->BH; bh++) {
    int64_t i = in_off(a, bh), u = out_off(a, bh);
    bwd_slice(kk, a, q + i, k + i, kt + bh * tsz, vt + bh * tsz, o + u, lse + bh * a->T, go + u,
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
static bool use_amx(const attn_dims *a, loom_dtype dt) {
  return dt == LOOM_BF16 && a->T > 0 && loom__attn_amx_fits(a->D);
}

static const uint16_t *h16(const loom_tensor *t) { return loom_tensor_data(t); }

/* Forward on AMX: each slice's k and v packed into w ([BH, fwd_elems] bf16), then bands of
 * query rows as attn_fwd walks them. q, k, v: bf16 slices as attn_dims says; o f32. */
static void amx_fwd(const attn_dims *a, const uint16_t *q, const uint16_t *k, const uint16_t *v,
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
static int amx_work_new(const attn_dims *a, bool backward, loom_tensor **out) {
  size_t T = (size_t)a->T, D = (size_t)a->D;
  int64_t shape[2] = {backward ? loom__gemm_threads() : a->BH,
                      (int64_t)(backward ? (loom__attn_amx_bwd_bytes(T, D) + 63) / 64 * 32
                                         : loom__attn_amx_fwd_elems(T, D))};
  return loom_tensor_empty(LOOM_BF16, 2, shape, out);
}

/* Backward on AMX: the slices dealt out to the threads in turn (slice bh to worker bh mod n),
 * each worker with its own work area. q, k, v, o: bf16; go, lse, dq, dk, dv: f32. */
static void amx_bwd(const attn_dims *a, const uint16_t *q, const uint16_t *k, const uint16_t *v,
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

static attn_dims dims_of(int ndim, const int64_t *shape, bool causal) {
  attn_dims a = {1, shape[ndim - 2], shape[ndim - 1], shape[ndim - 2] + 16, causal, 1.0f, 1,
                 shape[ndim - 1], shape[ndim - 1]};
  for (int i = 0; i < ndim - 2; i++) a.BH *= shape[i];
  if (a.D > 0) a.scale = (float)(1.0 / sqrt((double)a.D));
  return a;
}

/* Record the op's node (when autograd wants one): i[0] causal, i[1] heads, saved[0..n) the
 * given tensors, saved[n] the logsumexp (taken: *lse becomes NULL). */
static int record(loom__op *c, loom_tensor *y, loom__backward_fn bwd, bool causal, int64_t heads,
                  loom_tensor *const *save, int n, loom_tensor **lse) {
  loom__node *nd = NULL;
  int rc = loom__op_record(c, y, bwd, &nd);
  if (rc || !nd) return rc;
  nd->i[0] = causal;
  nd->i[1] = heads;
  for (int k = 0; k < n && !rc; k++) rc = loom__node_save(nd, k, save[k]);
  if (!rc) {
    nd->saved[n] = *lse;
    *lse = NULL;
  }
  return rc;
}

/* A scratch tensor for k or v transposed: [BH, D, ldt] f32. */
static int transposed_new(const attn_dims *a, loom_tensor **out) {
  int64_t shape[3] = {a->BH, a->D, a->ldt};
  return loom_tensor_empty(LOOM_F32, 3, shape, out);
}

/* saved: q, k, v, the output, lse [B, H, T] (f32). */
static int sdpa_backward(loom__node *n, loom_tensor *g, loom_tensor **gin) {
  int rc = LOOM_OK;
  loom__fbuf f[4] = {{0}};
  loom_tensor *gr[3] = {0}, *t[2] = {0}; /* t: k and v transposed */
  attn_dims a = dims_of(n->out_ndim, n->out_shape, n->i[0] != 0);
  if (use_amx(&a, n->saved[0]->dtype) && n->saved[3]->dtype == LOOM_BF16) {
    for (int k = 0; k < 3; k++) LOOM_TRY(loom__grad_new(n->out_ndim, n->out_shape, false, &gr[k]));
    LOOM_TRY(amx_work_new(&a, true, &t[0]));
    if (!loom__dry())
      amx_bwd(&a, h16(n->saved[0]), h16(n->saved[1]), h16(n->saved[2]), h16(n->saved[3]),
              loom__f(g), loom__f(n->saved[4]), loom__f(gr[0]), loom__f(gr[1]), loom__f(gr[2]),
              t[0]);
    goto give;
  }
  for (int k = 0; k < 4; k++) LOOM_TRY(loom__f32_in(n->saved[k], &f[k]));
  for (int k = 0; k < 3; k++) LOOM_TRY(loom__grad_new(n->out_ndim, n->out_shape, true, &gr[k]));
  for (int k = 0; k < 2; k++) LOOM_TRY(transposed_new(&a, &t[k]));
  if (!loom__dry())
    attn_bwd(&a, f[0].p, f[1].p, f[2].p, loom__f(t[0]), loom__f(t[1]), f[3].p,
             loom__f(n->saved[4]), loom__f(g), loom__f(gr[0]), loom__f(gr[1]), loom__f(gr[2]));
give:
  for (int k = 0; k < 3; k++)
    if (loom__node_needs(n, k)) {
      gin[k] = gr[k];
      gr[k] = NULL;
    }
done:
  for (int k = 0; k < 4; k++) loom__fbuf_free(&f[k]);
  for (int k = 0; k < 3; k++) loom_tensor_free(gr[k]);
  for (int k = 0; k < 2; k++) loom_tensor_free(t[k]);
  return rc;
}

int loom_scaled_dot_product_attention(loom_tensor *q, loom_tensor *k, loom_tensor *v,
                                      bool is_causal, loom_tensor **out) {
  static const char *name = "scaled_dot_product_attention";
  int rc = loom__check_out(name, out);
  if (rc) return rc;
  if ((rc = loom__check_float(name, q, "q")) || (rc = loom__check_float(name, k, "k")) ||
      (rc = loom__check_float(name, v, "v")))
    return rc;
  char s1[96], s2[96];
  if (q->ndim != 4)
    return loom__fail(LOOM_ESHAPE, "%s: q has shape %s (rank %d), expected [B, H, T, D]", name,
                      loom__shape_str(q->ndim, q->shape, s1, sizeof s1), q->ndim);
  const loom_tensor *kv[2] = {k, v};
  for (int i = 0; i < 2; i++)
    if (!loom_tensor_same_shape(q, kv[i]))
      return loom__fail(LOOM_ESHAPE, "%s: %s has shape %s, q has %s (they must match)", name,
                        i ? "v" : "k", loom__shape_str(kv[i]->ndim, kv[i]->shape, s1, sizeof s1),
                        loom__shape_str(q->ndim, q->shape, s2, sizeof s2));
  loom__op c;
  loom_tensor *in[3] = {q, k, v}, *y = NULL, *lse = NULL, *kt = NULL; /* kt: k transposed */
  loom__fbuf fq = {0}, fk = {0}, fv = {0}, fy = {0};
  if ((rc = loom__op_begin(&c, LOOM_OPK_SDPA, in, 3))) return rc;
  q = c.in[0];
  k = c.in[1];
  v = c.in[2];
  LOOM_TRY(loom__check_same_dtype(name, q, k));
  LOOM_TRY(loom__check_same_dtype(name, q, v));
  attn_dims a = dims_of(q->ndim, q->shape, is_causal);
  LOOM_TRY(loom_tensor_empty(LOOM_F32, 3, q->shape, &lse)); /* [B, H, T] */
  if (use_amx(&a, q->dtype)) {
    LOOM_TRY(loom__f32_out(q->dtype, q->ndim, q->shape, &y, &fy));
    LOOM_TRY(amx_work_new(&a, false, &kt));
    if (!loom__dry())
      amx_fwd(&a, h16(q), h16(k), h16(v), loom_tensor_data(kt), fy.p, loom__f(lse));
    goto out;
  }
  LOOM_TRY(loom__f32_in(q, &fq));
  LOOM_TRY(loom__f32_in(k, &fk));
  LOOM_TRY(loom__f32_in(v, &fv));
  LOOM_TRY(loom__f32_out(q->dtype, q->ndim, q->shape, &y, &fy));
  LOOM_TRY(transposed_new(&a, &kt));
  if (!loom__dry()) /* a dry run (loom/alloc.h): every buffer made, nothing computed */
    attn_fwd(&a, fq.p, loom__f(kt), fk.p, fv.p, fy.p, loom__f(lse));
out:
  loom__f32_out_commit(y, &fy);
  loom_tensor *save[4] = {q, k, v, y};
  LOOM_TRY(record(&c, y, sdpa_backward, is_causal, 0, save, 4, &lse));
done:
  loom__fbuf_free(&fq);
  loom__fbuf_free(&fk);
  loom__fbuf_free(&fv);
  loom__fbuf_free(&fy);
  loom_tensor_free(lse);
  loom_tensor_free(kt);
  return loom__op_finish(&c, rc, y, out);
}

/* ---- packed: q, k, v side by side in one [B, T, 3C] tensor ------------------------------ */

/* 16-bit qkv without AMX: one batch element at a time, its [T, 3C] rows (and in backward the
 * output's [T, C]) widened into a per-thread f32 area, with a head's k (and v) transposed
 * beside them, so that nothing is staged whole (a GPT's qkv is 19 MB as f32: written once and
 * read back from memory, where a batch element's 1.2 MB stays near the core). The kernels and
 * their order are the f32 path's: the same bits as staging the whole tensor. */
static int64_t stage_floats(const attn_dims *a) {
  return a->T * (a->ldi + a->ldo) + 2 * a->D * a->ldt;
}

/* The per-thread areas: [threads, stage_floats] f32 (a tensor, so that a dry run counts it). */
static int stage_new(const attn_dims *a, loom_tensor **out) {
  int64_t shape[2] = {loom__gemm_threads(), stage_floats(a)};
  return loom_tensor_empty(LOOM_F32, 2, shape, out);
}

#ifdef _OPENMP
static int thread_num(void) { return omp_get_thread_num(); }
#else
static int thread_num(void) { return 0; }
#endif

/* Batch element b's area in the calling thread's part of work: x (its qkv widened to f32,
 * [T, ldi]), then o ([T, C]) and kt (one head's transposed k, and v's in backward). */
static float *stage_batch(const attn_dims *a, const void *qkv, loom_dtype dt, loom_tensor *work,
                          int64_t b, float **o, float **kt) {
  int64_t T = a->T, C = a->ldo;
  float *x = loom__f(work) + thread_num() * work->shape[1];
  *o = x + T * a->ldi, *kt = *o + T * C;
  loom_convert((const char *)qkv + (size_t)(b * T * a->ldi) * loom_dtype_size(dt), dt, x,
               LOOM_F32, (size_t)(T * a->ldi));
  return x;
}

/* y (dt, [B, T, C]) and lse from qkv (dt). */
static void staged_fwd(const attn_dims *a, const void *qkv, loom_dtype dt, void *y, float *lse,
                       loom_tensor *work) {
  const loom__attn_kernels *kk = loom__attn_k();
  int64_t B = a->BH / a->H, T = a->T, C = a->ldo;
  int nthr = (int)work->shape[0];
  size_t es = loom_dtype_size(dt);
#pragma omp parallel for schedule(dynamic, 1) num_threads(nthr) if (nthr > 1 && B > 1)
  for (int64_t b = 0; b < B; b++) {
    float *o, *kt, *x = stage_batch(a, qkv, dt, work, b, &o, &kt);
    for (int64_t h = 0; h < a->H; h++) {
      kk->transpose(kt, (size_t)a->ldt, x + C + h * a->D, (size_t)a->ldi, (size_t)T,
                    (size_t)a->D, a->scale);
      fwd_rows(kk, a, x + h * a->D, kt, x + 2 * C + h * a->D, o + h * a->D,
               lse + (b * a->H + h) * T, 0, T);
    }
    loom_convert(o, LOOM_F32, (char *)y + (size_t)(b * T * C) * es, dt, (size_t)(T * C));
  }
}

/* d (f32 [B, T, 3C], zeroed) from qkv and the output y (dt), lse and the output's gradient go
 * (f32). */
static void staged_bwd(const attn_dims *a, const void *qkv, const void *y, loom_dtype dt,
                       const float *lse, const float *go, float *d, loom_tensor *work) {
  const loom__attn_kernels *kk = loom__attn_k();
  int64_t B = a->BH / a->H, T = a->T, C = a->ldo, tsz = a->D * a->ldt;
  int nthr = (int)work->shape[0];
  size_t es = loom_dtype_size(dt);
#pragma omp parallel for schedule(dynamic, 1) num_threads(nthr) if (nthr > 1 && B > 1)
  for (int64_t b = 0; b < B; b++) {
    float *o, *kt, *x = stage_batch(a, qkv, dt, work, b, &o, &kt);
    loom_convert((const char *)y + (size_t)(b * T * C) * es, dt, o, LOOM_F32, (size_t)(T * C));
    for (int64_t h = 0; h < a->H; h++) {
      int64_t i = h * a->D, di = b * T * a->ldi + i;
      kk->transpose(kt, (size_t)a->ldt, x + C + i, (size_t)a->ldi, (size_t)T, (size_t)a->D,
                    a->scale);
      kk->transpose(kt + tsz, (size_t)a->ldt, x + 2 * C + i, (size_t)a->ldi, (size_t)T,
                    (size_t)a->D, 1.0f);
      bwd_slice(kk, a, x + i, x + C + i, kt, kt + tsz, o + i, lse + (b * a->H + h) * T,
                go + b * T * C + i, d + di, d + di + C, d + di + 2 * C);
    }
  }
}


/* The dims of loom_sdpa_qkv over qkv [B, T, 3C] with H heads. */
static attn_dims packed_dims(const int64_t *shape, int64_t H, bool causal) {
  int64_t C = shape[2] / 3, D = C / H, T = shape[1];
  attn_dims a = {shape[0] * H, T, D, T + 16, causal, 1.0f, H, 3 * C, C};
  if (D > 0) a.scale = (float)(1.0 / sqrt((double)D));
  return a;
}

/* saved: qkv, the output, lse [B * H, T] (f32); i[0] causal, i[1] heads. */
static int sdpa_qkv_backward(loom__node *n, loom_tensor *g, loom_tensor **gin) {
  int rc = LOOM_OK;
  loom__fbuf fx = {0}, fy = {0};
  loom_tensor *gr = NULL, *t[2] = {0};
  const loom_tensor *qkv = n->saved[0];
  attn_dims a = packed_dims(qkv->shape, n->i[1], n->i[0] != 0);
  int64_t C = a.ldo;
  if (use_amx(&a, qkv->dtype) && n->saved[1]->dtype == LOOM_BF16) {
    LOOM_TRY(loom__grad_new(3, qkv->shape, false, &gr));
    LOOM_TRY(amx_work_new(&a, true, &t[0]));
    if (!loom__dry()) {
      const uint16_t *x = h16(qkv);
      float *d = loom__f(gr);
      amx_bwd(&a, x, x + C, x + 2 * C, h16(n->saved[1]), loom__f(g), loom__f(n->saved[2]), d,
              d + C, d + 2 * C, t[0]);
    }
    goto give;
  }
  if (qkv->dtype != LOOM_F32 && n->saved[1]->dtype == qkv->dtype &&
      loom_tensor_is_contiguous(qkv) && loom_tensor_is_contiguous(n->saved[1])) {
    LOOM_TRY(loom__grad_new(3, qkv->shape, true, &gr));
    LOOM_TRY(stage_new(&a, &t[0]));
    if (!loom__dry())
      staged_bwd(&a, loom_tensor_data(qkv), loom_tensor_data(n->saved[1]), qkv->dtype,
                 loom__f(n->saved[2]), loom__f(g), loom__f(gr), t[0]);
    goto give;
  }
  LOOM_TRY(loom__f32_in(qkv, &fx));
  LOOM_TRY(loom__f32_in(n->saved[1], &fy));
  LOOM_TRY(loom__grad_new(3, qkv->shape, true, &gr));
  for (int k = 0; k < 2; k++) LOOM_TRY(transposed_new(&a, &t[k]));
  if (!loom__dry()) {
    float *d = loom__f(gr);
    attn_bwd(&a, fx.p, fx.p + C, fx.p + 2 * C, loom__f(t[0]), loom__f(t[1]), fy.p,
             loom__f(n->saved[2]), loom__f(g), d, d + C, d + 2 * C);
  }
give:
  if (loom__node_needs(n, 0)) {
    gin[0] = gr;
    gr = NULL;
  }
done:
  loom__fbuf_free(&fx);
  loom__fbuf_free(&fy);
  loom_tensor_free(gr);
  for (int k = 0; k < 2; k++) loom_tensor_free(t[k]);
  return rc;
}

int loom_sdpa_qkv(loom_tensor *qkv, int64_t heads, bool is_causal, loom_tensor **out) {
  static const char *name = "sdpa_qkv";
  int rc = loom__check_out(name, out);
  if (rc) return rc;
  if ((rc = loom__check_float(name, qkv, "qkv"))) return rc;
  char s1[96];
  if (qkv->ndim != 3)
    return loom__fail(LOOM_ESHAPE, "%s: qkv has shape %s (rank %d), expected [B, T, 3C]", name,
                      loom__shape_str(qkv->ndim, qkv->shape, s1, sizeof s1), qkv->ndim);
  if (heads < 1 || qkv->shape[2] % 3 != 0 || (qkv->shape[2] / 3) % heads != 0)
    return loom__fail(LOOM_ESHAPE, "%s: qkv's last dim %lld is not 3 x heads (%lld) x a head's "
                      "width", name, (long long)qkv->shape[2], (long long)heads);
  loom__op c;
  loom_tensor *in[1] = {qkv}, *y = NULL, *lse = NULL, *kt = NULL;
  loom__fbuf fx = {0}, fy = {0};
  if ((rc = loom__op_begin(&c, LOOM_OPK_SDPA, in, 1))) return rc;
  qkv = c.in[0];
  attn_dims a = packed_dims(qkv->shape, heads, is_causal);
  int64_t C = a.ldo, yshape[3] = {qkv->shape[0], qkv->shape[1], C},
          lshape[2] = {a.BH, a.T};
  LOOM_TRY(loom_tensor_empty(LOOM_F32, 2, lshape, &lse));
  if (use_amx(&a, qkv->dtype)) {
    LOOM_TRY(loom__f32_out(qkv->dtype, 3, yshape, &y, &fy));
    LOOM_TRY(amx_work_new(&a, false, &kt));
    if (!loom__dry()) {
      const uint16_t *x = h16(qkv);
      amx_fwd(&a, x, x + C, x + 2 * C, loom_tensor_data(kt), fy.p, loom__f(lse));
    }
    goto out;
  }
  if (qkv->dtype != LOOM_F32 && loom_tensor_is_contiguous(qkv)) { /* a batch element a time */
    LOOM_TRY(loom_tensor_empty(qkv->dtype, 3, yshape, &y));
    LOOM_TRY(stage_new(&a, &kt));
    if (!loom__dry())
      staged_fwd(&a, loom_tensor_data(qkv), qkv->dtype, loom_tensor_data(y), loom__f(lse), kt);
    goto out;
  }
  LOOM_TRY(loom__f32_in(qkv, &fx));
  LOOM_TRY(loom__f32_out(qkv->dtype, 3, yshape, &y, &fy));
  LOOM_TRY(transposed_new(&a, &kt));
  if (!loom__dry())
    attn_fwd(&a, fx.p, loom__f(kt), fx.p + C, fx.p + 2 * C, fy.p, loom__f(lse));
out:
  loom__f32_out_commit(y, &fy);
  loom_tensor *save[2] = {qkv, y};
  LOOM_TRY(record(&c, y, sdpa_qkv_backward, is_causal, heads, save, 2, &lse));
done:
  loom__fbuf_free(&fx);
  loom__fbuf_free(&fy);
  loom_tensor_free(lse);
  loom_tensor_free(kt);
  return loom__op_finish(&c, rc, y, out);
}

/* ---- the unfused reference ---------------------------------------------------------------- */

int loom__sdpa_unfused(loom_tensor *q, loom_tensor *k, loom_tensor *v, bool is_causal,
                       loom_tensor **out) {
  int rc = loom__check_out("sdpa_unfused", out);
  if (rc) return rc;
  if ((rc = loom__check_float("sdpa_unfused", q, "q"))) return rc;
  loom_tensor *kt = NULL, *s = NULL, *ss = NULL, *mask = NULL, *mk = NULL, *sm = NULL,
              *p = NULL;
  int64_t T = q->shape[q->ndim - 2], D = q->shape[q->ndim - 1], mshape[2] = {T, T};
  LOOM_TRY(loom_transpose(k, -2, -1, &kt));
  LOOM_TRY(loom_matmul(q, kt, &s));
  LOOM_TRY(loom_mul_scalar(s, D > 0 ? 1.0 / sqrt((double)D) : 1.0, &ss));
  if (is_causal) {
    LOOM_TRY(loom_tensor_empty(LOOM_F32, 2, mshape, &mask));
    float *m = loom__f(mask);
    for (int64_t i = 0; i < T && !loom__dry(); i++)
      for (int64_t j = 0; j < T; j++) m[i * T + j] = j <= i ? 0.0f : -INFINITY;
    LOOM_TRY(loom_cast(mask, ss->dtype, &mk));
    LOOM_TRY(loom_add(ss, mk, &sm));
  }
  LOOM_TRY(loom_softmax(sm ? sm : ss, -1, &p));
  LOOM_TRY(loom_matmul(p, v, out));
done:
  loom_tensor_free(kt);
  loom_tensor_free(s);
  loom_tensor_free(ss);
  loom_tensor_free(mask);
  loom_tensor_free(mk);
  loom_tensor_free(sm);
  loom_tensor_free(p);
  return rc;
}
