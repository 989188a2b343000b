/* conv_dnnl.c: 2-D convolution forward, backward-data and backward-weights on oneDNN's
 * convolution primitives, NCHW activations and OIHW weights as the caller stores them.
 *
 * f32 runs natively, and bf16 where oneDNN has bf16 kernels for this CPU (AVX-512; bf16
 * accumulates in f32 inside oneDNN). f16, and bf16 elsewhere, is widened to f32 copies (exact),
 * run in f32 and rounded back once: the numbers of the f32 convolution of the same values. Primitives are cached like the GEMM's
 * (gemm_prim.c); a backward primitive is built with its forward descriptor as the hint, as
 * oneDNN requires. */
#include "ops/gemm_int.h"

#include <stdatomic.h>
#include <string.h>

enum { KEY_FWD = 2, KEY_BWD_DATA = 3, KEY_BWD_WEIGHTS = 4 };
enum { K_N, K_C, K_H, K_W, K_O, K_KH, K_KW, K_SH, K_SW, K_PH, K_PW, K_DT, K_BIAS };

typedef struct conv_mds {
  dnnl_memory_desc_t x, w, b, y;
  dnnl_dims_t strides, pad_l, pad_r;
} conv_mds;

static int conv_out(int64_t in, int64_t k, int64_t s, int64_t p) {
  return (int)((in + 2 * p - k) / s + 1);
}

static int make_mds(const loom__prim_key *key, const char *who, conv_mds *d) {
  int rc = LOOM_OK;
  const int64_t *v = key->v;
  dnnl_data_type_t dt = v[K_DT] == LOOM_BF16 ? dnnl_bf16 : dnnl_f32;
  int64_t oh = conv_out(v[K_H], v[K_KH], v[K_SH], v[K_PH]);
  int64_t ow = conv_out(v[K_W], v[K_KW], v[K_SW], v[K_PW]);
  LOOM_TRY(
      loom__dnnl_check(dnnl_memory_desc_init_by_tag(
                           &d->x, 4, (dnnl_dims_t){v[K_N], v[K_C], v[K_H], v[K_W]}, dt, dnnl_nchw),
                       who, "memory descriptor of x"));
  LOOM_TRY(loom__dnnl_check(
      dnnl_memory_desc_init_by_tag(&d->w, 4, (dnnl_dims_t){v[K_O], v[K_C], v[K_KH], v[K_KW]}, dt,
                                   dnnl_oihw),
      who, "memory descriptor of w"));
  LOOM_TRY(
      loom__dnnl_check(dnnl_memory_desc_init_by_tag(&d->b, 1, (dnnl_dims_t){v[K_O]}, dt, dnnl_a),
                       who, "memory descriptor of b"));
  LOOM_TRY(loom__dnnl_check(
      dnnl_memory_desc_init_by_tag(&d->y, 4, (dnnl_dims_t){v[K_N], v[K_O], oh, ow}, dt, dnnl_nchw),
      who, "memory descriptor of y"));
  d->strides[0] = v[K_SH], d->strides[1] = v[K_SW];
  d->pad_l[0] = v[K_PH], d->pad_l[1] = v[K_PW];
  /* right padding that makes oneDNN's output size formula give oh, ow (may be < pad_l) */
  d->pad_r[0] = (oh - 1) * v[K_SH] + v[K_KH] - v[K_H] - v[K_PH];
  d->pad_r[1] = (ow - 1) * v[K_SW] + v[K_KW] - v[K_W] - v[K_PW];
done:
  return rc;
}

static int fwd_pd(const conv_mds *d, bool bias, const_dnnl_primitive_attr_t attr, dnnl_engine_t eng,
                  const char *who, dnnl_primitive_desc_t *out) {
  dnnl_convolution_desc_t desc;
  int rc = loom__dnnl_check(dnnl_convolution_forward_desc_init(
                                &desc, dnnl_forward_training, dnnl_convolution_direct, &d->x, &d->w,
                                bias ? &d->b : NULL, &d->y, d->strides, d->pad_l, d->pad_r),
                            who, "convolution descriptor");
  if (rc != LOOM_OK) return rc;
  return loom__dnnl_check(dnnl_primitive_desc_create(out, &desc, attr, eng, NULL), who,
                          "convolution primitive descriptor");
}

static int build_conv(const loom__prim_key *key, const_dnnl_primitive_attr_t attr,
                      dnnl_engine_t eng, const char *who, dnnl_primitive_desc_t *out) {
  int rc = LOOM_OK;
  conv_mds d;
  dnnl_primitive_desc_t hint = NULL;
  dnnl_convolution_desc_t desc;
  LOOM_TRY(make_mds(key, who, &d));
  if (key->kind == KEY_FWD) return fwd_pd(&d, key->v[K_BIAS] != 0, attr, eng, who, out);
  LOOM_TRY(fwd_pd(&d, key->v[K_BIAS] != 0, NULL, eng, who, &hint));
  if (key->kind == KEY_BWD_DATA)
    LOOM_TRY(loom__dnnl_check(
        dnnl_convolution_backward_data_desc_init(&desc, dnnl_convolution_direct, &d.x, &d.w, &d.y,
                                                 d.strides, d.pad_l, d.pad_r),
        who, "convolution backward-data descriptor"));
  else
    LOOM_TRY(loom__dnnl_check(dnnl_convolution_backward_weights_desc_init(
                                  &desc, dnnl_convolution_direct, &d.x, &d.w,
                                  key->v[K_BIAS] ? &d.b : NULL, &d.y, d.strides, d.pad_l, d.pad_r),
                              who, "convolution backward-weights descriptor"));
  LOOM_TRY(loom__dnnl_check(dnnl_primitive_desc_create(out, &desc, attr, eng, hint), who,
                            "convolution backward primitive descriptor"));
done:
  if (hint) dnnl_primitive_desc_destroy(hint);
  return rc;
}

/* Runs one convolution kind natively (f32 or bf16); bufs[3] is the bias (or NULL). */
static int conv_native(int kind, const loom__conv2d_args *a, loom_dtype dt, const char *who, int n,
                       const loom__dnnl_buf *bufs, bool bias) {
  loom__prim_key key = loom__prim_key_make(kind, loom__gemm_threads());
  const int64_t v[] = {a->N,        a->C,        a->H,     a->W,     a->O,        a->KH, a->KW,
                       a->stride_h, a->stride_w, a->pad_h, a->pad_w, (int64_t)dt, bias};
  memcpy(key.v, v, sizeof v);
  loom__prim p;
  int rc = loom__prim_get(&key, build_conv, who, &p);
  if (rc != LOOM_OK) return rc;
  rc = loom__prim_run(&p, who, n, bufs);
  loom__prim_release(&p);
  return rc;
}

/* Element counts of x, w, b and y. */
static void conv_sizes(const loom__conv2d_args *a, size_t n[4]) {
  int64_t oh = conv_out(a->H, a->KH, a->stride_h, a->pad_h);
  int64_t ow = conv_out(a->W, a->KW, a->stride_w, a->pad_w);
  n[0] = (size_t)(a->N * a->C * a->H * a->W);
  n[1] = (size_t)(a->O * a->C * a->KH * a->KW);
  n[2] = (size_t)a->O;
  n[3] = (size_t)(a->N * a->O * oh * ow);
}

/* bf16 convolutions run on oneDNN kernels on this CPU: asked once per process (oneDNN 2.6 has
 * them with AVX-512 only), where they are faster than widening (loom__bf16_kernel_fast). The
 * forward probe answers for the three passes. */
bool loom__conv2d_native(loom_dtype dtype) {
  if (dtype != LOOM_BF16) return dtype == LOOM_F32;
  static _Atomic int answer;
  loom__prim_key key = loom__prim_key_make(KEY_FWD, 1);
  const int64_t v[] = {1, 8, 8, 8, 8, 3, 3, 1, 1, 1, 1, LOOM_BF16, 0};
  memcpy(key.v, v, sizeof v);
  return loom__prim_probe_bf16(&answer, &key, build_conv);
}

/* One convolution: `ptr[i]` is the caller's buffer for bufs' argument i (tensor `which[i]`:
 * 0 x, 1 w, 2 b, 3 y), `out[i]` whether the kernel writes it. A dtype without native kernels
 * runs on f32 copies: inputs widened (exact), outputs rounded once. */
static int conv_run(int kind, const loom__conv2d_args *a, const char *who, int n, const int *args,
                    const int *which, void *const *ptr, const bool *out, bool bias) {
  int rc = LOOM_OK;
  loom__dnnl_buf bufs[4];
  float *tmp[4] = {NULL};
  size_t sizes[4];
  conv_sizes(a, sizes);
  bool widen = !loom__conv2d_native(a->dtype);
  for (int i = 0; i < n; i++) {
    bufs[i].arg = args[i];
    bufs[i].ptr = ptr[i];
    if (!widen) continue;
    LOOM__GEMM_ALLOC(tmp[i], sizes[which[i]] * sizeof(float), who, "an f32 copy of an operand");
    if (!out[i]) loom_convert(ptr[i], a->dtype, tmp[i], LOOM_F32, sizes[which[i]]);
    bufs[i].ptr = tmp[i];
  }
  LOOM_TRY(conv_native(kind, a, widen ? LOOM_F32 : a->dtype, who, n, bufs, bias));
  for (int i = 0; i < n; i++)
    if (widen && out[i]) loom_convert(tmp[i], LOOM_F32, ptr[i], a->dtype, sizes[which[i]]);
done:
  for (int i = 0; i < 4; i++) loom__free(tmp[i]);
  return rc;
}

int loom__conv2d_fwd(const loom__conv2d_args *a, const void *x, const void *w, const void *b,
                     void *y) {
  const char *who = "loom__conv2d_fwd";
  int rc = loom__conv2d_check(a, who, x, "x", w, "w", y, "y");
  if (rc != LOOM_OK) return rc;
  const int args[] = {DNNL_ARG_SRC, DNNL_ARG_WEIGHTS, DNNL_ARG_DST, DNNL_ARG_BIAS};
  const int which[] = {0, 1, 3, 2};
  void *const ptr[] = {(void *)x, (void *)w, y, (void *)b};
  const bool out[] = {false, false, true, false};
  return conv_run(KEY_FWD, a, who, b ? 4 : 3, args, which, ptr, out, b != NULL);
}

int loom__conv2d_bwd_data(const loom__conv2d_args *a, const void *dy, const void *w, void *dx) {
  const char *who = "loom__conv2d_bwd_data";
  int rc = loom__conv2d_check(a, who, dy, "dy", w, "w", dx, "dx");
  if (rc != LOOM_OK) return rc;
  const int args[] = {DNNL_ARG_DIFF_DST, DNNL_ARG_WEIGHTS, DNNL_ARG_DIFF_SRC};
  const int which[] = {3, 1, 0};
  void *const ptr[] = {(void *)dy, (void *)w, dx};
  const bool out[] = {false, false, true};
  return conv_run(KEY_BWD_DATA, a, who, 3, args, which, ptr, out, false);
}

int loom__conv2d_bwd_weights(const loom__conv2d_args *a, const void *x, const void *dy, void *dw,
                             void *db) {
  const char *who = "loom__conv2d_bwd_weights";
  int rc = loom__conv2d_check(a, who, x, "x", dy, "dy", dw, "dw");
  if (rc != LOOM_OK) return rc;
  const int args[] = {DNNL_ARG_SRC, DNNL_ARG_DIFF_DST, DNNL_ARG_DIFF_WEIGHTS, DNNL_ARG_DIFF_BIAS};
  const int which[] = {0, 3, 1, 2};
  void *const ptr[] = {(void *)x, (void *)dy, dw, db};
  const bool out[] = {false, false, true, true};
  return conv_run(KEY_BWD_WEIGHTS, a, who, db ? 4 : 3, args, which, ptr, out, db != NULL);
}
