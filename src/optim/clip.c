/* clip.c: gradient-norm clipping, the one implementation and its one rule (loom/optim.h:
 * torch.nn.utils.clip_grad_norm_, with error_if_nonfinite), split into the pieces a sharded
 * caller puts a collective between (local sum of squares, coefficient from the total, scaling),
 * over f32, f16 and bf16 buffers; the entries over segments and tensors; and the deferred form
 * for gradients still multiplied by a loss scale (the coefficient folded into grad_scale). */
#include "optim/optim_int.h"

#include <math.h>

/* f16 / bf16 buffers go through f32 in blocks of this many elements (a multiple of 16, so a
 * block starts on lane 0). */
#define BLOCK 512

void loom__sumsq_add(double lane[16], const float *x, size_t n, size_t start) {
  size_t head = (16 - start % 16) % 16;
  if (head > n) head = n;
  loom__sumsq_lanes(lane, x, head, start);
  if (n > head) loom__optim_k()->sumsq(lane, x + head, n - head);
}

static void widen(const loom_grad_buf *b, size_t at, float *dst, size_t n) {
  loom__widen(b->dtype, (const uint16_t *)b->data + at, dst, n);
}

static void narrow(const loom_grad_buf *b, size_t at, const float *src, size_t n) {
  loom__narrow(b->dtype, src, (uint16_t *)b->data + at, n);
}

static int check_bufs(const char *who, const loom_grad_buf *bufs, size_t nbuf) {
  if (nbuf && !bufs) return loom__fail(LOOM_EINVAL, "%s: bufs is NULL", who);
  for (size_t i = 0; i < nbuf; i++) {
    const loom_grad_buf *b = &bufs[i];
    if (!loom_dtype_is_float(b->dtype))
      return loom__fail(LOOM_EDTYPE, "%s: gradient %zu is %s, not f32, f16 or bf16", who, i,
                        loom_dtype_name(b->dtype));
    if (b->n && !b->data) return loom__fail(LOOM_EINVAL, "%s: gradient %zu has no data", who, i);
  }
  return LOOM_OK;
}

/* The sum of squares of one checked buffer: its own 16 lanes, folded. */
static double buf_sumsq(const loom_grad_buf *b) {
  double lane[16] = {0};
  if (b->dtype == LOOM_F32) {
    loom__sumsq_add(lane, b->data, b->n, 0);
  } else {
    float tmp[BLOCK];
    for (size_t at = 0; at < b->n; at += BLOCK) {
      size_t m = b->n - at < BLOCK ? b->n - at : BLOCK;
      widen(b, at, tmp, m);
      loom__sumsq_add(lane, tmp, m, at);
    }
  }
  return loom__sumsq_fold(lane);
}

static void buf_scale(const loom_grad_buf *b, float coef) {
  if (b->dtype == LOOM_F32) {
    if (b->n) loom__optim_k()->scale(b->data, coef, b->n);
    return;
  }
  float tmp[BLOCK];
  for (size_t at = 0; at < b->n; at += BLOCK) {
    size_t m = b->n - at < BLOCK ? b->n - at : BLOCK;
    widen(b, at, tmp, m);
    loom__optim_k()->scale(tmp, coef, m);
    narrow(b, at, tmp, m);
  }
}

int loom__grad_sumsq(const char *who, const loom_grad_buf *bufs, size_t nbuf, double *out) {
  if (!out) return loom__fail(LOOM_EINVAL, "%s: out is NULL", who);
  int rc = check_bufs(who, bufs, nbuf);
  if (rc) return rc;
  double sum = 0.0;
  for (size_t i = 0; i < nbuf; i++) sum += buf_sumsq(&bufs[i]);
  *out = sum;
  return LOOM_OK;
}

int loom__grad_scale(const char *who, const loom_grad_buf *bufs, size_t nbuf, float coef) {
  int rc = check_bufs(who, bufs, nbuf);
  if (rc) return rc;
  for (size_t i = 0; i < nbuf; i++) buf_scale(&bufs[i], coef);
  return LOOM_OK;
}

int loom__clip_check(const char *who, double max_norm) {
  if (!(max_norm >= 0))
    return loom__fail(LOOM_EINVAL, "%s: max_norm = %g must be >= 0 (not NaN)", who, max_norm);
  return LOOM_OK;
}

/* PyTorch: clip_coef = max_norm / (total_norm + 1e-6) on an f32 norm, where a Python number
 * divided by a tensor is reciprocal(tensor) * number, all in f32; then clamp(max=1), which
 * keeps NaN. */
int loom__clip_coef(const char *who, double total_norm, double max_norm, bool error_if_nonfinite,
                    float *coef) {
  int rc = loom__clip_check(who, max_norm);
  if (rc) return rc;
  if (!isfinite(total_norm) && error_if_nonfinite)
    return loom__fail(LOOM_EINVAL,
                      "%s: total norm is %s (error_if_nonfinite); gradients left unchanged", who,
                      isnan(total_norm) ? "nan" : "inf");
  float t = (float)total_norm + 1e-6f;
  float c = (1.0f / t) * (float)max_norm;
  *coef = c > 1.0f ? 1.0f : c;
  return LOOM_OK;
}

int loom_grad_sumsq(const loom_grad_buf *bufs, size_t nbuf, double *out) {
  return loom__grad_sumsq("loom_grad_sumsq", bufs, nbuf, out);
}

int loom_grad_scale(const loom_grad_buf *bufs, size_t nbuf, float coef) {
  return loom__grad_scale("loom_grad_scale", bufs, nbuf, coef);
}

int loom_clip_coef(double total_norm, double max_norm, bool error_if_nonfinite, float *coef) {
  if (!coef) return loom__fail(LOOM_EINVAL, "loom_clip_coef: coef is NULL");
  return loom__clip_coef("loom_clip_coef", total_norm, max_norm, error_if_nonfinite, coef);
}

/* The whole rule over checked buffers: the norm (times inv_scale) reported, the coefficient,
 * and the gradients scaled unless `deferred` (then *coef is all the caller wants). */
static int clip_bufs(const char *who, const loom_grad_buf *bufs, size_t nbuf, double max_norm,
                     double inv_scale, bool error_if_nonfinite, bool deferred, double *total_norm,
                     float *coef) {
  int rc = loom__clip_check(who, max_norm);
  double sum = 0.0;
  if (!rc) rc = loom__grad_sumsq(who, bufs, nbuf, &sum);
  if (rc) return rc;
  double total = sqrt(sum) * inv_scale;
  if (total_norm) *total_norm = total;
  if ((rc = loom__clip_coef(who, total, max_norm, error_if_nonfinite, coef))) return rc;
  if (deferred || *coef == 1.0f) return LOOM_OK; /* x 1 changes no value */
  return loom__grad_scale(who, bufs, nbuf, *coef);
}

/* Segments as f32 buffers (a small list on the stack). */
typedef struct buf_list {
  loom_grad_buf *v;
  loom_grad_buf small[16];
} buf_list;

static int list_alloc(const char *who, size_t n, buf_list *l) {
  l->v = n <= 16 ? l->small : loom__malloc(LOOM_POOL_COMPUTE, n * sizeof *l->v);
  return l->v ? LOOM_OK : loom__fail(LOOM_ENOMEM, "%s: out of memory", who);
}

static void list_free(buf_list *l) {
  if (l->v != l->small) loom__free(l->v);
}

static int seg_list(const char *who, const loom_param_seg *segs, size_t nseg, buf_list *l) {
  if (nseg && !segs) return loom__fail(LOOM_EINVAL, "%s: segs is NULL", who);
  for (size_t i = 0; i < nseg; i++)
    if (segs[i].n && !segs[i].grad)
      return loom__fail(LOOM_EINVAL, "%s: segment %zu has a NULL grad", who, i);
  int rc = list_alloc(who, nseg, l);
  if (rc) return rc;
  for (size_t i = 0; i < nseg; i++)
    l->v[i] = (loom_grad_buf){(float *)segs[i].grad, segs[i].n, LOOM_F32};
  return LOOM_OK;
}

int loom_clip_grad_norm(const loom_param_seg *segs, size_t nseg, double max_norm,
                        bool error_if_nonfinite, double *total_norm) {
  static const char *who = "loom_clip_grad_norm";
  buf_list l;
  float coef;
  int rc = seg_list(who, segs, nseg, &l);
  if (rc) return rc;
  rc = clip_bufs(who, l.v, nseg, max_norm, 1.0, error_if_nonfinite, false, total_norm, &coef);
  list_free(&l);
  return rc;
}

int loom_clip_grad_norm_tensors(loom_tensor *const *grads, size_t n, double max_norm,
                                bool error_if_nonfinite, double *total_norm) {
  static const char *who = "loom_clip_grad_norm_tensors";
  if (n && !grads) return loom__fail(LOOM_EINVAL, "%s: grads is NULL", who);
  buf_list l;
  int rc = list_alloc(who, n, &l);
  if (rc) return rc;
  size_t nb = 0;
  for (size_t i = 0; i < n && !rc; i++) {
    loom_tensor *g = grads[i];
    if (!g) continue;
    loom_dtype dt = loom_tensor_dtype(g);
    size_t numel = loom_tensor_numel(g);
    void *data = loom_tensor_data(g);
    if (!loom_dtype_is_float(dt))
      rc = loom__fail(LOOM_EDTYPE, "%s: gradient %zu is %s, not f32, f16 or bf16", who, i,
                      loom_dtype_name(dt));
    else if (!loom_tensor_is_contiguous(g))
      rc = loom__fail(LOOM_EINVAL, "%s: gradient %zu is not contiguous", who, i);
    else if (numel && !data)
      rc = loom__fail(LOOM_EINVAL, "%s: gradient %zu has no data", who, i);
    else
      l.v[nb++] = (loom_grad_buf){data, numel, dt};
  }
  float coef;
  if (!rc)
    rc = clip_bufs(who, l.v, nb, max_norm, 1.0, error_if_nonfinite, false, total_norm, &coef);
  list_free(&l);
  return rc;
}

int loom_clip_grad_norm_scaled(const loom_param_seg *segs, size_t nseg, double max_norm,
                               float inv_scale, bool error_if_nonfinite, double *total_norm,
                               float *grad_scale) {
  static const char *who = "loom_clip_grad_norm_scaled";
  if (!grad_scale) return loom__fail(LOOM_EINVAL, "%s: grad_scale is NULL", who);
  if (!(inv_scale > 0) || !isfinite(inv_scale))
    return loom__fail(LOOM_EINVAL, "%s: inv_scale = %g must be finite and > 0", who,
                      (double)inv_scale);
  buf_list l;
  float coef;
  int rc = seg_list(who, segs, nseg, &l);
  if (rc) return rc;
  rc = clip_bufs(who, l.v, nseg, max_norm, inv_scale, error_if_nonfinite, true, total_norm,
                 &coef);
  list_free(&l);
  if (!rc) *grad_scale = inv_scale * coef;
  return rc;
}
