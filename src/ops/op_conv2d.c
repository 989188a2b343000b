/* op_conv2d.c: the conv2d op (NCHW, stride, zero padding, optional bias), forward and
 * backward through the convolution kernels of gemm.h. The kernels take one dtype for all
 * operands, so backward rounds the f32 output gradient to the op's dtype and widens the
 * kernel's results to f32. */
#include "ops/gemm.h"
#include "ops/ops_int.h"

/* src (dtype dt) as an f32 tensor: src itself when dt is f32. */
static int widen(loom_dtype dt, loom_tensor *src, loom_tensor **out) {
  if (dt == LOOM_F32) {
    *out = loom_tensor_retain(src);
    return LOOM_OK;
  }
  return loom_tensor_cast(src, LOOM_F32, out);
}

static void args_of(const loom__node *n, loom__conv2d_args *a) {
  const int64_t *xs = n->in[0].shape, *ws = n->in[1].shape;
  *a = (loom__conv2d_args){.N = xs[0], .C = xs[1], .H = xs[2], .W = xs[3], .O = ws[0],
                           .KH = ws[2], .KW = ws[3], .stride_h = n->i[0], .stride_w = n->i[1],
                           .pad_h = n->i[2], .pad_w = n->i[3], .dtype = n->in[0].dtype};
}

static int conv_backward(loom__node *n, loom_tensor *g, loom_tensor **gin) {
  int rc = LOOM_OK;
  loom__conv2d_args a;
  args_of(n, &a);
  loom_tensor *gd = NULL, *t[3] = {0};
  bool has_b = n->n_in > 2 && loom__node_needs(n, 2);
  if (a.dtype == LOOM_F32) gd = loom_tensor_retain(g);
  else LOOM_TRY(loom_tensor_cast(g, a.dtype, &gd));
  bool want[3] = {loom__node_needs(n, 0), loom__node_needs(n, 1) || has_b, has_b};
  for (int k = 0; k < 3; k++) /* kernel outputs in the op's dtype */
    if (want[k]) LOOM_TRY(loom_tensor_empty(a.dtype, n->in[k].ndim, n->in[k].shape, &t[k]));
  if (loom__node_needs(n, 0))
    LOOM_TRY(loom__conv2d_bwd_data(&a, loom_tensor_data(gd), loom_tensor_data(n->saved[1]),
                                   loom_tensor_data(t[0])));
  if (want[1])
    LOOM_TRY(loom__conv2d_bwd_weights(&a, loom_tensor_data(n->saved[0]), loom_tensor_data(gd),
                                      loom_tensor_data(t[1]), has_b ? loom_tensor_data(t[2]) : NULL));
  for (int k = 0; k < 3; k++)
    if (t[k] && loom__node_needs(n, k)) LOOM_TRY(widen(a.dtype, t[k], &gin[k]));
done:
  loom_tensor_free(gd);
  for (int k = 0; k < 3; k++) loom_tensor_free(t[k]);
  return rc;
}

int loom_conv2d(loom_tensor *x, loom_tensor *w, loom_tensor *b, const int64_t stride[2],
                const int64_t padding[2], loom_tensor **out) {
  static const char *name = "conv2d";
  int rc = loom__check_out(name, out);
  if (rc) return rc;
  if ((rc = loom__check_float(name, x, "x")) || (rc = loom__check_float(name, w, "w")) ||
      (b && (rc = loom__check_float(name, b, "b"))))
    return rc;
  if (!stride || !padding) return loom__fail(LOOM_EINVAL, "%s: stride or padding is NULL", name);
  if (stride[0] < 1 || stride[1] < 1 || padding[0] < 0 || padding[1] < 0)
    return loom__fail(LOOM_EINVAL, "%s: stride (%lld, %lld) must be >= 1 and padding (%lld, %lld) >= 0",
                      name, (long long)stride[0], (long long)stride[1], (long long)padding[0],
                      (long long)padding[1]);
  char s1[96], s2[96];
  if (x->ndim != 4 || w->ndim != 4 || x->shape[1] != w->shape[1])
    return loom__fail(LOOM_ESHAPE, "%s: x %s and w %s are not [N, C, H, W] and [O, C, KH, KW]",
                      name, loom__shape_str(x->ndim, x->shape, s1, sizeof s1),
                      loom__shape_str(w->ndim, w->shape, s2, sizeof s2));
  if (b && (b->ndim != 1 || b->shape[0] != w->shape[0]))
    return loom__fail(LOOM_ESHAPE, "%s: bias %s does not match %lld output channels", name,
                      loom__shape_str(b->ndim, b->shape, s1, sizeof s1), (long long)w->shape[0]);
  int64_t ph = x->shape[2] + 2 * padding[0], pw = x->shape[3] + 2 * padding[1];
  if (ph < w->shape[2] || pw < w->shape[3])
    return loom__fail(LOOM_ESHAPE, "%s: kernel %lldx%lld is larger than the padded input %lldx%lld",
                      name, (long long)w->shape[2], (long long)w->shape[3], (long long)ph,
                      (long long)pw);
  loom__op c;
  loom_tensor *in[3] = {x, w, b}, *cx = NULL, *cw = NULL, *cb = NULL, *y = NULL;
  loom__node *nd = NULL;
  if ((rc = loom__op_begin(&c, LOOM_OPK_CONV2D, in, b ? 3 : 2))) return rc;
  x = c.in[0];
  w = c.in[1];
  b = b ? c.in[2] : NULL;
  LOOM_TRY(loom__check_same_dtype(name, x, w));
  if (b) LOOM_TRY(loom__check_same_dtype(name, x, b));
  int64_t shape[4] = {x->shape[0], w->shape[0], (ph - w->shape[2]) / stride[0] + 1,
                      (pw - w->shape[3]) / stride[1] + 1};
  LOOM_TRY(loom_tensor_contiguous(x, &cx));
  LOOM_TRY(loom_tensor_contiguous(w, &cw));
  if (b) LOOM_TRY(loom_tensor_contiguous(b, &cb));
  LOOM_TRY(loom_tensor_zeros(x->dtype, 4, shape, &y));
  if (loom_tensor_numel(y) && x->shape[1] && w->shape[2] && w->shape[3]) {
    loom__conv2d_args a = {.N = x->shape[0], .C = x->shape[1], .H = x->shape[2], .W = x->shape[3],
                           .O = w->shape[0], .KH = w->shape[2], .KW = w->shape[3],
                           .stride_h = stride[0], .stride_w = stride[1], .pad_h = padding[0],
                           .pad_w = padding[1], .dtype = x->dtype};
    LOOM_TRY(loom__conv2d_fwd(&a, loom_tensor_data(cx), loom_tensor_data(cw),
                              cb ? loom_tensor_data(cb) : NULL, loom_tensor_data(y)));
  }
  LOOM_TRY(loom__op_record(&c, y, conv_backward, &nd));
  if (nd) {
    nd->i[0] = stride[0];
    nd->i[1] = stride[1];
    nd->i[2] = padding[0];
    nd->i[3] = padding[1];
    LOOM_TRY(loom__node_save(nd, 0, cx));
    LOOM_TRY(loom__node_save(nd, 1, cw));
  }
done:
  loom_tensor_free(cx);
  loom_tensor_free(cw);
  loom_tensor_free(cb);
  return loom__op_finish(&c, rc, y, out);
}
