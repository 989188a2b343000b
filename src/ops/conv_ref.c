/* conv_ref.c: scalar references of the 2-D convolution kernels, for the tests. Direct loops
 * over the definition (zero padding), each output an f32 sum rounded once to the dtype; the
 * backward passes gather rather than scatter so that no temporary is needed. */
#include "ops/gemm_int.h"

typedef struct geom {
  int64_t N, C, H, W, O, KH, KW, sh, sw, ph, pw, OH, OW;
} geom;

static geom geom_of(const loom__conv2d_args *a) {
  geom g = {a->N,        a->C,        a->H,     a->W,     a->O, a->KH, a->KW,
            a->stride_h, a->stride_w, a->pad_h, a->pad_w, 0,    0};
  g.OH = (g.H + 2 * g.ph - g.KH) / g.sh + 1;
  g.OW = (g.W + 2 * g.pw - g.KW) / g.sw + 1;
  return g;
}

static float ld(const void *p, loom_dtype dt, int64_t i) {
  return (float)loom__load_f64(p, dt, (size_t)i);
}

int loom__conv2d_fwd_ref(const loom__conv2d_args *a, const void *x, const void *w, const void *b,
                         void *y) {
  int rc = loom__conv2d_check(a, "loom__conv2d_fwd_ref", x, "x", w, "w", y, "y");
  if (rc != LOOM_OK || loom__dry()) return rc;
  geom g = geom_of(a);
  for (int64_t n = 0; n < g.N; n++)
    for (int64_t o = 0; o < g.O; o++)
      for (int64_t oh = 0; oh < g.OH; oh++)
        for (int64_t ow = 0; ow < g.OW; ow++) {
          float acc = 0.0f;
          for (int64_t c = 0; c < g.C; c++)
            for (int64_t kh = 0; kh < g.KH; kh++)
              for (int64_t kw = 0; kw < g.KW; kw++) {
                int64_t ih = oh * g.sh - g.ph + kh, iw = ow * g.sw - g.pw + kw;
                if (ih < 0 || ih >= g.H || iw < 0 || iw >= g.W) continue;
                acc += ld(x, a->dtype, ((n * g.C + c) * g.H + ih) * g.W + iw) *
                       ld(w, a->dtype, ((o * g.C + c) * g.KH + kh) * g.KW + kw);
              }
          if (b) acc += ld(b, a->dtype, o);
          loom__store_f64(y, a->dtype, (size_t)(((n * g.O + o) * g.OH + oh) * g.OW + ow), acc);
        }
  return LOOM_OK;
}

int loom__conv2d_bwd_data_ref(const loom__conv2d_args *a, const void *dy, const void *w, void *dx) {
  int rc = loom__conv2d_check(a, "loom__conv2d_bwd_data_ref", dy, "dy", w, "w", dx, "dx");
  if (rc != LOOM_OK || loom__dry()) return rc;
  geom g = geom_of(a);
  for (int64_t n = 0; n < g.N; n++)
    for (int64_t c = 0; c < g.C; c++)
      for (int64_t ih = 0; ih < g.H; ih++)
        for (int64_t iw = 0; iw < g.W; iw++) {
          float acc = 0.0f;
          for (int64_t o = 0; o < g.O; o++)
            for (int64_t kh = 0; kh < g.KH; kh++)
              for (int64_t kw = 0; kw < g.KW; kw++) {
                int64_t th = ih + g.ph - kh, tw = iw + g.pw - kw; /* = oh * sh, ow * sw */
                if (th < 0 || tw < 0 || th % g.sh || tw % g.sw) continue;
                int64_t oh = th / g.sh, ow = tw / g.sw;
                if (oh >= g.OH || ow >= g.OW) continue;
                acc += ld(dy, a->dtype, ((n * g.O + o) * g.OH + oh) * g.OW + ow) *
                       ld(w, a->dtype, ((o * g.C + c) * g.KH + kh) * g.KW + kw);
              }
          loom__store_f64(dx, a->dtype, (size_t)(((n * g.C + c) * g.H + ih) * g.W + iw), acc);
        }
  return LOOM_OK;
}

int loom__conv2d_bwd_weights_ref(const loom__conv2d_args *a, const void *x, const void *dy,
                                 void *dw, void *db) {
  int rc = loom__conv2d_check(a, "loom__conv2d_bwd_weights_ref", x, "x", dy, "dy", dw, "dw");
  if (rc != LOOM_OK || loom__dry()) return rc;
  geom g = geom_of(a);
  for (int64_t o = 0; o < g.O; o++) {
    for (int64_t c = 0; c < g.C; c++)
      for (int64_t kh = 0; kh < g.KH; kh++)
        for (int64_t kw = 0; kw < g.KW; kw++) {
          float acc = 0.0f;
          for (int64_t n = 0; n < g.N; n++)
            for (int64_t oh = 0; oh < g.OH; oh++)
              for (int64_t ow = 0; ow < g.OW; ow++) {
                int64_t ih = oh * g.sh - g.ph + kh, iw = ow * g.sw - g.pw + kw;
                if (ih < 0 || ih >= g.H || iw < 0 || iw >= g.W) continue;
                acc += ld(dy, a->dtype, ((n * g.O + o) * g.OH + oh) * g.OW + ow) *
                       ld(x, a->dtype, ((n * g.C + c) * g.H + ih) * g.W + iw);
              }
          loom__store_f64(dw, a->dtype, (size_t)(((o * g.C + c) * g.KH + kh) * g.KW + kw), acc);
        }
    if (!db) continue;
    float acc = 0.0f;
    for (int64_t n = 0; n < g.N; n++)
      for (int64_t i = 0; i < g.OH * g.OW; i++)
        acc += ld(dy, a->dtype, (n * g.O + o) * g.OH * g.OW + i);
    loom__store_f64(db, a->dtype, (size_t)o, acc);
  }
  return LOOM_OK;
}
