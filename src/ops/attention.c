/* attention.c: scaled dot-product attention as ops (PyTorch's F.scaled_dot_product_attention
 * with is_causal): loom_scaled_dot_product_attention over q, k, v [B, H, T, D], and
 * loom_sdpa_qkv, which reads q, k and v in place from one [B, T, 3C] tensor (GPT-2's c_attn
 * output) and writes [B, T, C], so that a GPT's attention neither copies heads apart and
 * together nor sums three sliced gradients. Both check their inputs, pick the path (bf16 on
 * AMX tiles; f16 / bf16 staged to f32, loom_sdpa_qkv's a batch element at a time per thread;
 * f32) and record their backward; the recurrence itself is attn_fused.c's. Also the unfused
 * matmul-softmax-matmul reference the tests and benchmarks compare with. */
#include "ops/attn_fused.h"
#include "ops/gemm.h"
#include "ops/ops_int.h"

#include <math.h>
#ifdef _OPENMP
#include <omp.h>
#endif

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
  if (loom__attn_use_amx(&a, n->saved[0]->dtype) && n->saved[3]->dtype == LOOM_BF16) {
    for (int k = 0; k < 3; k++) LOOM_TRY(loom__grad_new(n->out_ndim, n->out_shape, false, &gr[k]));
    LOOM_TRY(loom__attn_amx_work_new(&a, true, &t[0]));
    if (!loom__dry())
      loom__attn_amx_run_bwd(&a, loom__attn_h16(n->saved[0]), loom__attn_h16(n->saved[1]), loom__attn_h16(n->saved[2]), loom__attn_h16(n->saved[3]),
              loom__f(g), loom__f(n->saved[4]), loom__f(gr[0]), loom__f(gr[1]), loom__f(gr[2]),
              t[0]);
    goto give;
  }
  for (int k = 0; k < 4; k++) LOOM_TRY(loom__f32_in(n->saved[k], &f[k]));
  for (int k = 0; k < 3; k++) LOOM_TRY(loom__grad_new(n->out_ndim, n->out_shape, true, &gr[k]));
  for (int k = 0; k < 2; k++) LOOM_TRY(transposed_new(&a, &t[k]));
  if (!loom__dry())
    loom__attn_bwd(&a, f[0].p, f[1].p, f[2].p, loom__f(t[0]), loom__f(t[1]), f[3].p,
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
  if (loom__attn_use_amx(&a, q->dtype)) {
    LOOM_TRY(loom__f32_out(q->dtype, q->ndim, q->shape, &y, &fy));
    LOOM_TRY(loom__attn_amx_work_new(&a, false, &kt));
    if (!loom__dry())
      loom__attn_amx_run_fwd(&a, loom__attn_h16(q), loom__attn_h16(k), loom__attn_h16(v), loom_tensor_data(kt), fy.p, loom__f(lse));
    goto out;
  }
  LOOM_TRY(loom__f32_in(q, &fq));
  LOOM_TRY(loom__f32_in(k, &fk));
  LOOM_TRY(loom__f32_in(v, &fv));
  LOOM_TRY(loom__f32_out(q->dtype, q->ndim, q->shape, &y, &fy));
  LOOM_TRY(transposed_new(&a, &kt));
  if (!loom__dry()) /* a dry run (loom/alloc.h): every buffer made, nothing computed */
    loom__attn_fwd(&a, fq.p, loom__f(kt), fk.p, fv.p, fy.p, loom__f(lse));
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
      loom__attn_fwd_rows(kk, a, x + h * a->D, kt, x + 2 * C + h * a->D, o + h * a->D,
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
      loom__attn_bwd_slice(kk, a, x + i, x + C + i, kt, kt + tsz, o + i, lse + (b * a->H + h) * T,
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
  if (loom__attn_use_amx(&a, qkv->dtype) && n->saved[1]->dtype == LOOM_BF16) {
    LOOM_TRY(loom__grad_new(3, qkv->shape, false, &gr));
    LOOM_TRY(loom__attn_amx_work_new(&a, true, &t[0]));
    if (!loom__dry()) {
      const uint16_t *x = loom__attn_h16(qkv);
      float *d = loom__f(gr);
      loom__attn_amx_run_bwd(&a, x, x + C, x + 2 * C, loom__attn_h16(n->saved[1]), loom__f(g), loom__f(n->saved[2]), d,
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
    loom__attn_bwd(&a, fx.p, fx.p + C, fx.p + 2 * C, loom__f(t[0]), loom__f(t[1]), fy.p,
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
  if (loom__attn_use_amx(&a, qkv->dtype)) {
    LOOM_TRY(loom__f32_out(qkv->dtype, 3, yshape, &y, &fy));
    LOOM_TRY(loom__attn_amx_work_new(&a, false, &kt));
    if (!loom__dry()) {
      const uint16_t *x = loom__attn_h16(qkv);
      loom__attn_amx_run_fwd(&a, x, x + C, x + 2 * C, loom_tensor_data(kt), fy.p, loom__f(lse));
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
    loom__attn_fwd(&a, fx.p, loom__f(kt), fx.p + C, fx.p + 2 * C, fy.p, loom__f(lse));
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
