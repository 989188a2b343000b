/* pool.c: max_pool2d and avg_pool2d over NCHW input with window, stride and zero padding,
 * forward and backward, in f32. max pooling records each output's argmax (the first maximal
 * element of the window) for backward; avg pooling divides by the full window size
 * (count_include_pad). */
#include "ops/ops_int.h"

#include <math.h>

typedef struct pool_geom {
  int64_t NC, H, W, OH, OW, kh, kw, sh, sw, ph, pw;
} pool_geom;

static void geom_of(const int64_t *xs, const int64_t *p, pool_geom *g) {
  *g = (pool_geom){.NC = xs[0] * xs[1], .H = xs[2], .W = xs[3], .kh = p[0], .kw = p[1],
                   .sh = p[2], .sw = p[3], .ph = p[4], .pw = p[5]};
  g->OH = (g->H + 2 * g->ph - g->kh) / g->sh + 1;
  g->OW = (g->W + 2 * g->pw - g->kw) / g->sw + 1;
}

static int pool_backward(loom__node *n, loom_tensor *g, loom_tensor **gin) {
  pool_geom pg;
  geom_of(n->in[0].shape, n->i, &pg);
  int rc = loom__grad_new(4, n->in[0].shape, true, &gin[0]);
  if (rc || loom__dry()) return rc;
  float *gx = loom__f(gin[0]);
  const float *gy = loom__f(g);
  size_t ny = (size_t)(pg.NC * pg.OH * pg.OW);
  if (n->kind == LOOM_OPK_MAX_POOL2D) {
    const int64_t *arg = loom_tensor_data(n->saved[0]);
    for (size_t i = 0; i < ny; i++)
      if (arg[i] >= 0) gx[arg[i]] += gy[i];
    return LOOM_OK;
  }
  float inv = 1.0f / (float)(pg.kh * pg.kw);
  for (int64_t p = 0; p < pg.NC; p++)
    for (int64_t oh = 0; oh < pg.OH; oh++)
      for (int64_t ow = 0; ow < pg.OW; ow++) {
        float v = gy[(p * pg.OH + oh) * pg.OW + ow] * inv;
        for (int64_t a = 0; a < pg.kh; a++)
          for (int64_t b = 0; b < pg.kw; b++) {
            int64_t ih = oh * pg.sh - pg.ph + a, iw = ow * pg.sw - pg.pw + b;
            if (ih >= 0 && ih < pg.H && iw >= 0 && iw < pg.W) gx[(p * pg.H + ih) * pg.W + iw] += v;
          }
      }
  return LOOM_OK;
}

static int pool(loom_op_kind kind, loom_tensor *x, const int64_t kernel[2],
                const int64_t stride[2], const int64_t padding[2], loom_tensor **out) {
  const char *name = loom_op_kind_name(kind);
  int rc = loom__check_out(name, out);
  if (rc) return rc;
  if ((rc = loom__check_float(name, x, "x"))) return rc;
  if (!kernel || !stride || !padding)
    return loom__fail(LOOM_EINVAL, "%s: kernel, stride or padding is NULL", name);
  char s1[96];
  if (x->ndim != 4)
    return loom__fail(LOOM_ESHAPE, "%s: x %s is not [N, C, H, W]", name,
                      loom__shape_str(x->ndim, x->shape, s1, sizeof s1));
  for (int i = 0; i < 2; i++) {
    if (kernel[i] < 1 || stride[i] < 1)
      return loom__fail(LOOM_EINVAL, "%s: kernel and stride must be >= 1, got %lld and %lld",
                        name, (long long)kernel[i], (long long)stride[i]);
    if (padding[i] < 0 || 2 * padding[i] > kernel[i])
      return loom__fail(LOOM_EINVAL, "%s: padding %lld must be in [0, kernel / 2 = %lld]", name,
                        (long long)padding[i], (long long)(kernel[i] / 2));
    if (x->shape[2 + i] + 2 * padding[i] < kernel[i])
      return loom__fail(LOOM_ESHAPE, "%s: window %lld is larger than the padded input %lld", name,
                        (long long)kernel[i], (long long)(x->shape[2 + i] + 2 * padding[i]));
  }
  int64_t params[6] = {kernel[0], kernel[1], stride[0], stride[1], padding[0], padding[1]};
  pool_geom pg;
  geom_of(x->shape, params, &pg);
  loom__op c;
  loom_tensor *y = NULL, *arg = NULL;
  loom__fbuf fx = {0}, fy = {0};
  loom__node *nd = NULL;
  bool is_max = kind == LOOM_OPK_MAX_POOL2D;
  if ((rc = loom__op_begin(&c, kind, &x, 1))) return rc;
  x = c.in[0];
  int64_t shape[4] = {x->shape[0], x->shape[1], pg.OH, pg.OW};
  LOOM_TRY(loom__f32_in(x, &fx));
  LOOM_TRY(loom__f32_out(x->dtype, 4, shape, &y, &fy));
  if (is_max) LOOM_TRY(loom_tensor_empty(LOOM_I64, 4, shape, &arg));
  int64_t *ap = arg ? loom_tensor_data(arg) : NULL;
  float inv = 1.0f / (float)(pg.kh * pg.kw);
  for (int64_t p = 0; p < pg.NC && !loom__dry(); p++)
    for (int64_t oh = 0; oh < pg.OH; oh++)
      for (int64_t ow = 0; ow < pg.OW; ow++) {
        float acc = is_max ? -INFINITY : 0.0f;
        int64_t best = -1;
        for (int64_t a = 0; a < pg.kh; a++)
          for (int64_t b = 0; b < pg.kw; b++) {
            int64_t ih = oh * pg.sh - pg.ph + a, iw = ow * pg.sw - pg.pw + b;
            if (ih < 0 || ih >= pg.H || iw < 0 || iw >= pg.W) continue;
            int64_t at = (p * pg.H + ih) * pg.W + iw;
            float v = fx.p[at];
            if (!is_max) acc += v;
            else if (v > acc || best < 0 || isnan(v)) acc = v, best = at;
          }
        int64_t o = (p * pg.OH + oh) * pg.OW + ow;
        fy.p[o] = is_max ? acc : acc * inv;
        if (ap) ap[o] = best;
      }
  loom__f32_out_commit(y, &fy);
  LOOM_TRY(loom__op_record(&c, y, pool_backward, &nd));
  if (nd) {
    for (int i = 0; i < 6; i++) nd->i[i] = params[i];
    nd->saved[0] = arg;
    arg = NULL;
  }
done:
  loom__fbuf_free(&fx);
  loom__fbuf_free(&fy);
  loom_tensor_free(arg);
  return loom__op_finish(&c, rc, y, out);
}

int loom_max_pool2d(loom_tensor *x, const int64_t kernel[2], const int64_t stride[2],
                    const int64_t padding[2], loom_tensor **out) {
  return pool(LOOM_OPK_MAX_POOL2D, x, kernel, stride, padding, out);
}

int loom_avg_pool2d(loom_tensor *x, const int64_t kernel[2], const int64_t stride[2],
                    const int64_t padding[2], loom_tensor **out) {
  return pool(LOOM_OPK_AVG_POOL2D, x, kernel, stride, padding, out);
}
