/* reduce.c: sum, mean and max over a set of dims (keepdim or not), forward and backward.
 * Accumulation is f32; backward broadcasts the gradient back over the reduced dims (max
 * sends it to the maximal elements, split evenly between ties, like torch.amax). */
#include "ops/ops_int.h"

#include <math.h>
#include <string.h>

typedef enum { R_SUM, R_MEAN, R_MAX } rop;
static const loom_op_kind kinds[] = {LOOM_OPK_SUM, LOOM_OPK_MEAN, LOOM_OPK_MAX};

/* Reduced-dim mask of x for dims; keep shape (reduced dims set to 1); out shape. */
static int plan(const char *name, const loom_tensor *x, const int *dims, int n_dims,
                bool keepdim, int64_t *keep, int *nout, int64_t *sout, size_t *count,
                int64_t *mask) {
  bool red[LOOM_MAX_DIMS] = {0};
  if (n_dims < 0 || (n_dims > 0 && !dims))
    return loom__fail(LOOM_EINVAL, "%s: dims is NULL or n_dims %d negative", name, n_dims);
  for (int i = 0; i < n_dims; i++) {
    int d;
    int rc = loom__norm_dim(name, dims[i], x->ndim, &d);
    if (rc) return rc;
    if (red[d]) return loom__fail(LOOM_EINVAL, "%s: dim %d given twice", name, dims[i]);
    red[d] = true;
  }
  *nout = 0;
  *count = 1;
  *mask = 0;
  for (int i = 0; i < x->ndim; i++) {
    bool r = n_dims == 0 || red[i];
    if (r) *mask |= (int64_t)1 << i;
    keep[i] = r ? 1 : x->shape[i];
    if (r) *count *= (size_t)x->shape[i];
    if (!r || keepdim) sout[(*nout)++] = keep[i];
  }
  return LOOM_OK;
}

static void run_max(int64_t n, float *d, const float *x, const float *unused, int64_t sd,
                    int64_t sx, int64_t s2, void *ctx) {
  if (sd == 0) {
    float m = d[0];
    for (int64_t i = 0; i < n; i++) m = x[i * sx] > m || isnan(x[i * sx]) ? x[i * sx] : m;
    d[0] = m;
  } else {
    for (int64_t i = 0; i < n; i++) d[i * sd] = x[i * sx] > d[i * sd] || isnan(x[i * sx]) ? x[i * sx] : d[i * sd];
  }
}

/* d = scale * g (broadcast), over the index space of d. */
static void run_bcast(int64_t n, float *d, const float *g, const float *unused, int64_t sd,
                      int64_t sg, int64_t s2, void *ctx) {
  float s = *(const float *)ctx;
  for (int64_t i = 0; i < n; i++) d[i * sd] = s * g[i * sg];
}

/* d = (x == y) ? 1 : 0 */
static void run_eq(int64_t n, float *d, const float *x, const float *y, int64_t sd, int64_t sx,
                   int64_t sy, void *ctx) {
  for (int64_t i = 0; i < n; i++) d[i * sd] = x[i * sx] == y[i * sy] ? 1.0f : 0.0f;
}

/* d = d * g / c (g and c broadcast) */
static void run_share(int64_t n, float *d, const float *g, const float *c, int64_t sd,
                      int64_t sg, int64_t sc, void *ctx) {
  for (int64_t i = 0; i < n; i++)
    if (d[i * sd] != 0.0f) d[i * sd] = g[i * sg] / c[i * sc];
}

static int reduce_backward(loom__node *n, loom_tensor *g, loom_tensor **gin) {
  rop op = (rop)n->i[0];
  int rc = LOOM_OK;
  const loom__edge *e = &n->in[0];
  int64_t keep[LOOM_MAX_DIMS], sx[LOOM_MAX_DIMS], sk[LOOM_MAX_DIMS];
  for (int i = 0; i < e->ndim; i++) keep[i] = n->i[1] & ((int64_t)1 << i) ? 1 : e->shape[i];
  loom__fbuf fx = {0}, fy = {0};
  float *cnt = NULL;
  LOOM_TRY(loom__grad_new(e->ndim, e->shape, false, &gin[0]));
  loom__bcast_strides(e->ndim, e->shape, e->ndim, e->shape, sx);
  loom__bcast_strides(e->ndim, e->shape, e->ndim, keep, sk);
  if (op != R_MAX) {
    float scale = (float)n->f[0];
    loom__iter3(e->ndim, e->shape, loom__f(gin[0]), sx, loom__f(g), sk, NULL, NULL, run_bcast,
                &scale);
    goto done;
  }
  LOOM_TRY(loom__f32_in(n->saved[0], &fx));
  LOOM_TRY(loom__f32_in(n->saved[1], &fy));
  size_t nk = loom_tensor_numel(g);
  cnt = loom__malloc(LOOM_POOL_COMPUTE, (nk ? nk : 1) * sizeof *cnt);
  LOOM_TRY_ALLOC(cnt, "tie counts");
  float *gx = loom__f(gin[0]);
  loom__iter3(e->ndim, e->shape, gx, sx, fx.p, sx, fy.p, sk, run_eq, NULL);
  loom__reduce_to(gx, e->ndim, e->shape, cnt, e->ndim, keep);
  loom__iter3(e->ndim, e->shape, gx, sx, loom__f(g), sk, cnt, sk, run_share, NULL);
done:
  loom__fbuf_free(&fx);
  loom__fbuf_free(&fy);
  loom__free(cnt);
  return rc;
}

static int reduce(rop op, loom_tensor *x, const int *dims, int n_dims, bool keepdim,
                  loom_tensor **out) {
  const char *name = loom_op_kind_name(kinds[op]);
  int rc = loom__check_out(name, out);
  if (rc) return rc;
  if ((rc = loom__check_float(name, x, "x"))) return rc;
  int64_t keep[LOOM_MAX_DIMS], sout[LOOM_MAX_DIMS];
  int nout = 0;
  size_t count = 0;
  int64_t mask = 0;
  if ((rc = plan(name, x, dims, n_dims, keepdim, keep, &nout, sout, &count, &mask))) return rc;
  if (op == R_MAX && count == 0)
    return loom__fail(LOOM_ESHAPE, "max: reducing over an empty dim has no maximum");
  loom__op c;
  loom_tensor *y = NULL;
  loom__fbuf fx = {0}, fy = {0};
  loom__node *nd = NULL;
  if ((rc = loom__op_begin(&c, kinds[op], &x, 1))) return rc;
  x = c.in[0];
  LOOM_TRY(loom__f32_in(x, &fx));
  LOOM_TRY(loom__f32_out(x->dtype, nout, sout, &y, &fy));
  size_t ny = loom_tensor_numel(y);
  if (op == R_MAX) {
    int64_t sd[LOOM_MAX_DIMS], sx[LOOM_MAX_DIMS];
    for (size_t i = 0; i < ny; i++) fy.p[i] = -INFINITY;
    loom__bcast_strides(x->ndim, x->shape, x->ndim, keep, sd);
    loom__bcast_strides(x->ndim, x->shape, x->ndim, x->shape, sx);
    loom__iter3(x->ndim, x->shape, fy.p, sd, fx.p, sx, NULL, NULL, run_max, NULL);
  } else {
    loom__reduce_to(fx.p, x->ndim, x->shape, fy.p, x->ndim, keep);
    if (op == R_MEAN) {
      float inv = count ? 1.0f / (float)count : NAN;
      for (size_t i = 0; i < ny; i++) fy.p[i] *= inv;
    }
  }
  loom__f32_out_commit(y, &fy);
  LOOM_TRY(loom__op_record(&c, y, reduce_backward, &nd));
  if (nd) {
    nd->i[0] = op;
    nd->i[1] = mask;
    nd->f[0] = op == R_MEAN ? 1.0 / (double)count : 1.0;
    if (op == R_MAX) {
      int64_t ks[LOOM_MAX_DIMS]; /* y seen with the reduced dims kept as 1 */
      loom__bcast_strides(x->ndim, keep, x->ndim, keep, ks);
      LOOM_TRY(loom__node_save(nd, 0, x));
      LOOM_TRY(loom__tensor_view(y, x->ndim, keep, ks, y->offset, &nd->saved[1]));
    }
  }
done:
  loom__fbuf_free(&fx);
  loom__fbuf_free(&fy);
  return loom__op_finish(&c, rc, y, out);
}

int loom_sum(loom_tensor *x, const int *dims, int n_dims, bool keepdim, loom_tensor **out) {
  return reduce(R_SUM, x, dims, n_dims, keepdim, out);
}
int loom_mean(loom_tensor *x, const int *dims, int n_dims, bool keepdim, loom_tensor **out) {
  return reduce(R_MEAN, x, dims, n_dims, keepdim, out);
}
int loom_max(loom_tensor *x, const int *dims, int n_dims, bool keepdim, loom_tensor **out) {
  return reduce(R_MAX, x, dims, n_dims, keepdim, out);
}
