/* gradcheck.c: the gradient checker of gradcheck.h (no tests of its own). */
#include "gradcheck.h"

#include <math.h>
#include <stdlib.h>

float gc_uniform(uint64_t *s, float lo, float hi) {
  uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  z ^= z >> 31;
  return lo + (hi - lo) * (float)((double)(z >> 11) / 9007199254740992.0);
}

loom_tensor *gc_rand(int ndim, const int64_t *shape, float lo, float hi, uint64_t *state) {
  loom_tensor *t = NULL;
  if (lo == 0 && hi == 0) lo = -1, hi = 1;
  loom_tensor_empty(LOOM_F32, ndim, shape, &t);
  float *p = loom_tensor_data(t);
  for (size_t i = 0; i < loom_tensor_numel(t); i++)
    p[i] = loom_bf16_to_f32(loom_f32_to_bf16(gc_uniform(state, lo, hi)));
  return t;
}

static double *read_f64(const loom_tensor *t) {
  size_t n = loom_tensor_numel(t);
  float *f = malloc((n ? n : 1) * sizeof *f);
  double *d = malloc((n ? n : 1) * sizeof *d);
  loom_tensor_read(t, LOOM_F32, f, n * sizeof *f);
  for (size_t i = 0; i < n; i++) d[i] = f[i];
  free(f);
  return d;
}

/* L = sum(y * R) in double, or NAN if the op fails. */
static double loss_of(gc_fn fn, void *ctx, loom_tensor **in, const double *r) {
  loom_tensor *y = NULL;
  loom_no_grad_enter();
  int rc = fn(in, &y, ctx);
  loom_no_grad_exit();
  if (rc) return NAN;
  double *v = read_f64(y), s = 0;
  for (size_t i = 0; i < loom_tensor_numel(y); i++) s += v[i] * r[i];
  free(v);
  loom_tensor_free(y);
  return s;
}

static double max_abs(const double *v, size_t n) {
  double m = 0;
  for (size_t i = 0; i < n; i++) m = fabs(v[i]) > m ? fabs(v[i]) : m;
  return m;
}

int gc_run(const char *what, gc_fn fn, void *ctx, int n, const gc_input *ins,
           const gc_opts *opts) {
  gc_opts o = opts ? *opts : (gc_opts){0};
  if (!o.eps) o.eps = 1e-2;
  if (!o.tol) o.tol = 1e-2;
  uint64_t st = o.seed ? o.seed : 1234;
  int fails = 0;
  loom_tensor *x[8] = {0}, *y = NULL, *rt = NULL;
  double *grads[8] = {0};
  for (int i = 0; i < n; i++) {
    x[i] = gc_rand(ins[i].ndim, ins[i].shape, ins[i].lo, ins[i].hi, &st);
    if (!ins[i].no_grad) loom_tensor_set_requires_grad(x[i], true);
  }
  int rc = fn(x, &y, ctx);
  if (rc) {
    lt_fail_at(__FILE__, __LINE__, "%s: f32 op failed: %s", what, loom_last_error());
    fails++;
    goto done;
  }
  rt = gc_rand(loom_tensor_ndim(y), loom_tensor_shape(y), -1, 1, &st);
  double *r = read_f64(rt), *y32 = read_f64(y);
  size_t ny = loom_tensor_numel(y);
  loom_tensor *ry = NULL; /* R in y's dtype (an op may change dtype: cast) */
  loom_tensor_cast(rt, loom_tensor_dtype(y), &ry);
  rc = loom_backward(y, ry, false);
  loom_tensor_free(ry);
  if (rc) {
    lt_fail_at(__FILE__, __LINE__, "%s: backward failed: %s", what, loom_last_error());
    fails++;
  }
  /* f32 against finite differences, at most ~48 elements per input */
  for (int i = 0; !rc && i < n; i++) {
    if (ins[i].no_grad) continue;
    loom_tensor *g = loom_tensor_grad(x[i]);
    if (!g) {
      lt_fail_at(__FILE__, __LINE__, "%s: input %d got no gradient", what, i);
      fails++;
      continue;
    }
    grads[i] = read_f64(g);
    size_t m = loom_tensor_numel(x[i]), step = m > 48 ? m / 48 : 1;
    float *p = loom_tensor_data(x[i]);
    for (size_t k = 0; k < m; k += step) {
      float keep = p[k];
      p[k] = keep + (float)o.eps;
      double lp = loss_of(fn, ctx, x, r);
      p[k] = keep - (float)o.eps;
      double lm = loss_of(fn, ctx, x, r);
      p[k] = keep;
      double num = (lp - lm) / (2 * o.eps), ana = grads[i][k];
      if (!(fabs(num - ana) <= o.tol * (1 + fabs(ana)))) {
        if (fails++ < 5)
          lt_fail_at(__FILE__, __LINE__, "%s: f32 d/dx%d[%zu]: analytic %.6g, numeric %.6g",
                     what, i, k, ana, num);
      }
    }
  }
  /* f16 and bf16 against the f32 op */
  for (int di = 0; !rc && !o.f32_only && di < 2; di++) {
    loom_dtype dt = di ? LOOM_BF16 : LOOM_F16;
    double tol = o.lp_tol ? o.lp_tol : (dt == LOOM_F16 ? 1e-2 : 3e-2);
    loom_tensor *xl[8] = {0}, *yl = NULL, *rl = NULL;
    for (int i = 0; i < n; i++) {
      loom_tensor_cast(x[i], dt, &xl[i]);
      if (!ins[i].no_grad) loom_tensor_set_requires_grad(xl[i], true);
    }
    if (fn(xl, &yl, ctx) || loom_tensor_dtype(yl) != dt) {
      lt_fail_at(__FILE__, __LINE__, "%s: %s op failed or changed dtype: %s", what,
                 loom_dtype_name(dt), loom_last_error());
      fails++;
    } else {
      double *yv = read_f64(yl), ym = max_abs(y32, ny);
      for (size_t k = 0; k < ny; k++)
        if (!(fabs(yv[k] - y32[k]) <= tol * ym + 1e-3)) {
          if (fails++ < 5)
            lt_fail_at(__FILE__, __LINE__, "%s: %s y[%zu] = %.6g, f32 %.6g", what,
                       loom_dtype_name(dt), k, yv[k], y32[k]);
        }
      free(yv);
      loom_tensor_cast(rt, dt, &rl);
      if (loom_backward(yl, rl, false)) {
        lt_fail_at(__FILE__, __LINE__, "%s: %s backward failed: %s", what, loom_dtype_name(dt),
                   loom_last_error());
        fails++;
      }
      for (int i = 0; i < n; i++) {
        if (ins[i].no_grad || !grads[i]) continue;
        loom_tensor *g = loom_tensor_grad(xl[i]);
        if (!g || loom_tensor_dtype(g) != dt) {
          lt_fail_at(__FILE__, __LINE__, "%s: %s gradient %d missing or not %s", what,
                     loom_dtype_name(dt), i, loom_dtype_name(dt));
          fails++;
          continue;
        }
        double *gv = read_f64(g);
        size_t m = loom_tensor_numel(g);
        double gm = max_abs(grads[i], m);
        for (size_t k = 0; k < m; k++)
          if (!(fabs(gv[k] - grads[i][k]) <= tol * gm + 1e-3)) {
            if (fails++ < 5)
              lt_fail_at(__FILE__, __LINE__, "%s: %s d/dx%d[%zu] = %.6g, f32 %.6g", what,
                         loom_dtype_name(dt), i, k, gv[k], grads[i][k]);
          }
        free(gv);
      }
    }
    for (int i = 0; i < n; i++) loom_tensor_free(xl[i]);
    loom_tensor_free(yl);
    loom_tensor_free(rl);
  }
  free(r);
  free(y32);
done:
  for (int i = 0; i < n; i++) {
    loom_tensor_free(x[i]);
    free(grads[i]);
  }
  loom_tensor_free(y);
  loom_tensor_free(rt);
  return fails;
}

double gc_rel_diff(loom_tensor *a, loom_tensor *b, double floor) {
  size_t n = loom_tensor_numel(b);
  float *x = malloc(n * sizeof *x), *y = malloc(n * sizeof *y);
  loom_tensor *ac = NULL, *bc = NULL;
  loom_tensor_contiguous(a, &ac);
  loom_tensor_contiguous(b, &bc);
  loom_convert(loom_tensor_data(ac), loom_tensor_dtype(ac), x, LOOM_F32, n);
  loom_convert(loom_tensor_data(bc), loom_tensor_dtype(bc), y, LOOM_F32, n);
  double md = 0, mb = floor;
  for (size_t i = 0; i < n; i++) {
    double d = fabs((double)x[i] - y[i]);
    md = d > md || d != d ? d : md;
    mb = fabs(y[i]) > mb ? fabs(y[i]) : mb;
  }
  free(x);
  free(y);
  loom_tensor_free(ac);
  loom_tensor_free(bc);
  return md / mb;
}
