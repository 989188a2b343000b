/* test_amp_autograd.c: the AMP autograd integration (amp-autograd-integration.md): the
 * context, forward casting and gradient dtypes under each autocast mode, backward of the scaled
 * loss with and without retain_graph, grad_amp, needs_amp_backward, gradient preparation
 * (unscale + overflow), conversion, compatibility checks, AMP graphs, custom AMP functions,
 * gradient accumulation over micro-batches and clipping after unscaling. */
#include "lt.h"

#include <math.h>
#include <stdlib.h>

static uint64_t rng_state;
static float frand(void) { /* uniform in [-1, 1) */
  rng_state = rng_state * 6364136223846793005ull + 1442695040888963407ull;
  return (float)((rng_state >> 40) * (1.0 / 16777216.0)) * 2.0f - 1.0f;
}

static loom_tensor *rand_tensor(loom_dtype dt, int ndim, const int64_t *shape, float amp,
                                bool grad) {
  size_t n = 1;
  for (int i = 0; i < ndim; i++) n *= (size_t)shape[i];
  float *v = malloc(n * sizeof *v);
  for (size_t i = 0; i < n; i++) v[i] = amp * frand();
  loom_tensor *f = NULL, *t = NULL;
  LT_OK(loom_tensor_from_data(LOOM_F32, ndim, shape, v, &f));
  if (dt == LOOM_F32) t = f;
  else {
    LT_OK(loom_tensor_cast(f, dt, &t));
    loom_tensor_free(f);
  }
  if (grad) LT_OK(loom_tensor_set_requires_grad(t, true));
  free(v);
  return t;
}

static double at(const loom_tensor *t, size_t i) { /* element i of a contiguous tensor */
  double v = 0;
  int64_t idx[LOOM_MAX_DIMS];
  size_t r = i;
  int nd = loom_tensor_ndim(t);
  for (int d = nd - 1; d >= 0; d--) {
    idx[d] = (int64_t)(r % (size_t)loom_tensor_shape(t)[d]);
    r /= (size_t)loom_tensor_shape(t)[d];
  }
  loom_tensor_get(t, idx, &v);
  return v;
}

/* max |a - k*b| / (max |k*b| + tiny) over all elements */
static double rel_err(const loom_tensor *a, const loom_tensor *b, double k) {
  double num = 0, den = 1e-30;
  for (size_t i = 0; i < loom_tensor_numel(a); i++) {
    num = fmax(num, fabs(at(a, i) - k * at(b, i)));
    den = fmax(den, fabs(k * at(b, i)));
  }
  return num / den;
}

/* A tiny model: logits = linear(x, w, b); loss = cross_entropy(logits, y). */
typedef struct tiny {
  loom_tensor *x, *y, *w, *b;
} tiny;

static tiny tiny_make(uint64_t seed, int64_t n) {
  rng_state = seed;
  tiny t = {0};
  t.x = rand_tensor(LOOM_F32, 2, (int64_t[]){n, 8}, 1.0f, false);
  t.w = rand_tensor(LOOM_F32, 2, (int64_t[]){4, 8}, 0.5f, true);
  t.b = rand_tensor(LOOM_F32, 1, (int64_t[]){4}, 0.1f, true);
  int64_t *lab = malloc((size_t)n * sizeof *lab);
  for (int64_t i = 0; i < n; i++) lab[i] = (i * 7 + 3) % 4;
  LT_OK(loom_tensor_from_data(LOOM_I64, 1, (int64_t[]){n}, lab, &t.y));
  free(lab);
  return t;
}

static void tiny_free(tiny *t) {
  loom_tensor_free(t->x);
  loom_tensor_free(t->y);
  loom_tensor_free(t->w);
  loom_tensor_free(t->b);
}

/* The loss under `mode` (rows [r0, r1) of the batch); logits dtype into *ldt if not NULL. */
static loom_tensor *tiny_loss(tiny *t, loom_autocast_mode mode, int64_t r0, int64_t r1,
                              loom_dtype *ldt) {
  loom_autocast_token tok;
  loom_tensor *xs = NULL, *ys = NULL, *lg = NULL, *loss = NULL;
  LT_OK(loom_autocast_enter(mode, NULL, &tok));
  LT_OK(loom_tensor_narrow(t->x, 0, r0, r1 - r0, &xs));
  LT_OK(loom_tensor_narrow(t->y, 0, r0, r1 - r0, &ys));
  LT_OK(loom_linear(xs, t->w, t->b, &lg));
  if (ldt) *ldt = loom_tensor_dtype(lg);
  LT_OK(loom_cross_entropy(lg, ys, LOOM_REDUCTION_MEAN, -100, &loss));
  LT_OK(loom_autocast_exit(&tok));
  loom_tensor_free(xs);
  loom_tensor_free(ys);
  loom_tensor_free(lg);
  return loss;
}

static loom_tensor *clone_grad(loom_tensor *p) {
  loom_tensor *c = NULL;
  LT_OK(loom_tensor_clone(loom_tensor_grad(p), &c));
  return c;
}

static void zero_grads(tiny *t) {
  LT_OK(loom_tensor_set_grad(t->w, NULL));
  LT_OK(loom_tensor_set_grad(t->b, NULL));
}

/* ---- the context ---------------------------------------------------------------------------- */

LT_TEST(amp_context_defaults_and_validation) {
  loom_amp_context c = loom_amp_context_default();
  LT_EQ(c.mode, LOOM_AUTOCAST_BF16);
  LT_TRUE(c.registry == NULL && c.scaler == NULL && !c.needs_unscaling);
  LT_OK(loom_amp_context_validate(&c));
  LT_TRUE(loom_amp_context_registry(&c) == loom_amp_registry_default(LOOM_AUTOCAST_BF16));
  loom_amp_registry *r = NULL;
  LT_OK(loom_amp_registry_create(LOOM_AUTOCAST_F16, &r));
  c.registry = r;
  LT_TRUE(loom_amp_context_registry(&c) == r);
  c.needs_unscaling = true;
  LT_ERR(loom_amp_context_validate(&c), LOOM_EINVAL, "needs_unscaling");
  c.needs_unscaling = false;
  c.mode = (loom_autocast_mode)7;
  LT_ERR(loom_amp_context_validate(&c), LOOM_EINVAL, "mode = 7");
  LT_ERR(loom_amp_context_validate(NULL), LOOM_EINVAL, "ctx is NULL");
  loom_amp_registry_free(r);
}

/* ---- forward casting and gradient dtypes, every mode ---------------------------------------- */

LT_TEST(amp_forward_casts_and_gradients_keep_parameter_dtype_in_every_mode) {
  tiny t = tiny_make(1, 16);
  loom_tensor *loss = tiny_loss(&t, LOOM_AUTOCAST_OFF, 0, 16, NULL);
  LT_OK(loom_backward(loss, NULL, false));
  loom_tensor *ref = clone_grad(t.w);
  loom_tensor_free(loss);
  const loom_autocast_mode modes[] = {LOOM_AUTOCAST_OFF, LOOM_AUTOCAST_F16, LOOM_AUTOCAST_BF16};
  const loom_dtype want[] = {LOOM_F32, LOOM_F16, LOOM_BF16};
  const double tol[] = {1e-6, 4e-3, 3e-2}; /* a few units of the low dtype's rounding */
  for (int m = 0; m < 3; m++) {
    zero_grads(&t);
    loom_dtype ldt;
    loss = tiny_loss(&t, modes[m], 0, 16, &ldt);
    LT_EQ(ldt, want[m]);                             /* linear: lower precision */
    LT_EQ(loom_tensor_dtype(loss), LOOM_F32);        /* cross entropy: f32 */
    LT_EQ(loom_needs_amp_backward(loss), m != 0);    /* low precision in the graph */
    loom_scaler *s = NULL;
    LT_OK(loom_scaler_create_static(1024, &s));
    LT_OK(loom_backward_amp(loss, s, false));
    LT_EQ(loom_tensor_dtype(loom_tensor_grad(t.w)), LOOM_F32); /* the parameter's dtype */
    LT_TRUE(rel_err(loom_tensor_grad(t.w), ref, 1024) < tol[m]); /* scaled by 1024 */
    loom_named_tensor g[2] = {{"w", loom_tensor_grad(t.w)}, {"b", loom_tensor_grad(t.b)}};
    bool ok = false;
    LT_OK(loom_amp_prepare_gradients(s, g, 2, true, NULL, &ok));
    LT_TRUE(ok);
    LT_TRUE(rel_err(loom_tensor_grad(t.w), ref, 1) < tol[m]);
    LT_OK(loom_scaler_update(s, !ok));
    loom_scaler_free(s);
    loom_tensor_free(loss);
  }
  loom_tensor_free(ref);
  tiny_free(&t);
}

LT_TEST(amp_backward_with_and_without_retain_graph) {
  tiny t = tiny_make(2, 8);
  loom_scaler *s = NULL;
  LT_OK(loom_scaler_create_dynamic(NULL, &s));
  loom_tensor *loss = tiny_loss(&t, LOOM_AUTOCAST_F16, 0, 8, NULL);
  LT_OK(loom_backward_amp(loss, s, true));
  loom_tensor *once = clone_grad(t.w);
  LT_OK(loom_backward_amp(loss, s, false)); /* the retained graph runs again: grads double */
  LT_TRUE(rel_err(loom_tensor_grad(t.w), once, 2) < 1e-6);
  LT_ERR(loom_backward_amp(loss, s, false), LOOM_EMISUSE, "already spent");
  /* a plain backward with no scaler is the same as loom_backward */
  zero_grads(&t);
  LT_OK(loom_backward_amp(loss = (loom_tensor_free(loss), tiny_loss(&t, LOOM_AUTOCAST_F16, 0, 8,
                                                                    NULL)),
                          NULL, false));
  LT_TRUE(rel_err(loom_tensor_grad(t.w), once, 1.0 / 65536) < 1e-6);
  /* bad losses */
  LT_ERR(loom_backward_amp(t.x, s, false), LOOM_ESHAPE, "not one");
  loom_tensor *c = NULL;
  LT_OK(loom_tensor_zeros(LOOM_F32, 0, NULL, &c));
  LT_ERR(loom_backward_amp(c, s, false), LOOM_EINVAL, "does not require grad");
  LT_ERR(loom_backward_amp(NULL, s, false), LOOM_EINVAL, "");
  loom_tensor_free(c);
  loom_tensor_free(once);
  loom_tensor_free(loss);
  loom_scaler_free(s);
  tiny_free(&t);
}

LT_TEST(amp_low_precision_loss_is_scaled_in_f32) {
  /* an f16 loss times 65536 would overflow f16 before backward starts; backward_amp scales it
   * in f32, so only a gradient that really exceeds f16 (here, 65536 * 1 in an f16 leaf) is
   * inf, and the scaler sees that as an overflow */
  loom_tensor *w = rand_tensor(LOOM_F16, 1, (int64_t[]){4}, 1.0f, true), *l = NULL;
  LT_OK(loom_sum(w, NULL, 0, false, &l));
  LT_EQ(loom_tensor_dtype(l), LOOM_F16);
  LT_TRUE(loom_needs_amp_backward(l));
  loom_scaler *s = NULL;
  LT_OK(loom_scaler_create_static(1024, &s));
  LT_OK(loom_backward_amp(l, s, true));
  loom_tensor *g = loom_tensor_grad(w);
  LT_EQ(loom_tensor_dtype(g), LOOM_F16);
  bool found = true;
  LT_OK(loom_scaler_unscale(s, &g, 1, &found));
  LT_TRUE(!found);
  for (size_t i = 0; i < 4; i++) LT_NEAR(at(g, i), 1.0, 0);
  loom_scaler_free(s);
  LT_OK(loom_scaler_create_dynamic(NULL, &s)); /* 65536 */
  LT_OK(loom_tensor_set_grad(w, NULL));
  LT_OK(loom_backward_amp(l, s, false));
  g = loom_tensor_grad(w);
  LT_OK(loom_scaler_unscale(s, &g, 1, &found));
  LT_TRUE(found);
  LT_OK(loom_scaler_update(s, found));
  LT_NEAR(loom_scaler_get_scale(s), 32768, 0);
  loom_scaler_free(s);
  loom_tensor_free(l);
  loom_tensor_free(w);
}

/* ---- grad_amp --------------------------------------------------------------------------------- */

LT_TEST(amp_grad_amp_gives_input_gradients_without_touching_leaves) {
  tiny t = tiny_make(3, 16);
  loom_tensor *loss = tiny_loss(&t, LOOM_AUTOCAST_OFF, 0, 16, NULL);
  LT_OK(loom_backward(loss, NULL, false));
  loom_tensor *rw = clone_grad(t.w), *rb = clone_grad(t.b);
  loom_tensor_free(loss);
  zero_grads(&t);
  loom_scaler *s = NULL;
  LT_OK(loom_scaler_create_dynamic(NULL, &s));
  loom_tensor *unused = rand_tensor(LOOM_F32, 1, (int64_t[]){3}, 1, true);
  loss = tiny_loss(&t, LOOM_AUTOCAST_BF16, 0, 16, NULL);
  loom_tensor *in[3] = {t.w, t.b, unused}, *g[3];
  bool found = true;
  LT_OK(loom_grad_amp(loss, in, 3, s, true, g, &found));
  LT_TRUE(!found);
  LT_TRUE(loom_tensor_grad(t.w) == NULL && loom_tensor_grad(t.b) == NULL); /* untouched */
  LT_TRUE(g[2] == NULL);                                                   /* unused */
  LT_EQ(loom_tensor_dtype(g[0]), LOOM_F32);
  LT_TRUE(rel_err(g[0], rw, 1) < 3e-2); /* unscaled; bf16 forward */
  LT_TRUE(rel_err(g[1], rb, 1) < 3e-2);
  /* the graph was retained: a second call gives the same values */
  loom_tensor *g2[3];
  LT_OK(loom_grad_amp(loss, in, 2, NULL, false, g2, NULL));
  LT_TRUE(rel_err(g2[0], g[0], 1) < 1e-6);
  loom_tensor_free(g2[0]);
  loom_tensor_free(g2[1]);
  LT_ERR(loom_grad_amp(loss, in, 2, NULL, false, g2, NULL), LOOM_EMISUSE, "already spent");
  LT_TRUE(g2[0] == NULL && g2[1] == NULL);
  LT_ERR(loom_grad_amp(loss, in, 0, NULL, false, g2, NULL), LOOM_EINVAL, "no inputs");
  loom_tensor *nog = rand_tensor(LOOM_F32, 1, (int64_t[]){3}, 1, false);
  loom_tensor_free(loss);
  loss = tiny_loss(&t, LOOM_AUTOCAST_OFF, 0, 16, NULL);
  LT_ERR(loom_grad_amp(loss, &nog, 1, NULL, false, g2, NULL), LOOM_EINVAL,
         "does not require grad");
  for (int k = 0; k < 3; k++) loom_tensor_free(g[k]);
  loom_tensor_free(nog);
  loom_tensor_free(unused);
  loom_tensor_free(loss);
  loom_tensor_free(rw);
  loom_tensor_free(rb);
  loom_scaler_free(s);
  tiny_free(&t);
}

LT_TEST(amp_grad_of_an_intermediate_tensor) {
  /* d(sum(h^2))/dh = 2h for h = relu(x) (a non-leaf input) */
  loom_tensor *x = rand_tensor(LOOM_F32, 1, (int64_t[]){6}, 1, true), *h = NULL, *q = NULL,
              *l = NULL, *g = NULL;
  LT_OK(loom_relu(x, &h));
  LT_OK(loom_mul(h, h, &q));
  LT_OK(loom_sum(q, NULL, 0, false, &l));
  LT_OK(loom_autograd_grad(l, NULL, &h, 1, false, &g));
  for (size_t i = 0; i < 6; i++) LT_NEAR(at(g, i), 2 * at(h, i), 1e-6);
  LT_TRUE(loom_tensor_grad(x) == NULL);
  loom_tensor_free(g);
  loom_tensor_free(l);
  loom_tensor_free(q);
  loom_tensor_free(h);
  loom_tensor_free(x);
}

/* ---- overflow, preparation, conversion ------------------------------------------------------ */

LT_TEST(amp_overflow_detection_during_backward) {
  tiny t = tiny_make(4, 8);
  /* an input beyond f16's range becomes inf under f16 autocast: the gradients go non-finite */
  LT_OK(loom_tensor_set(t.x, (int64_t[]){0, 0}, 1e6));
  loom_scaler *s = NULL;
  LT_OK(loom_scaler_create_dynamic(NULL, &s));
  loom_tensor *loss = tiny_loss(&t, LOOM_AUTOCAST_F16, 0, 8, NULL);
  LT_OK(loom_backward_amp(loss, s, false));
  loom_named_tensor g[2] = {{"w", loom_tensor_grad(t.w)}, {"b", loom_tensor_grad(t.b)}};
  bool ok = true;
  LT_OK(loom_amp_prepare_gradients(s, g, 2, true, NULL, &ok));
  LT_TRUE(!ok);
  LT_OK(loom_scaler_update(s, !ok));
  LT_NEAR(loom_scaler_get_scale(s), 32768, 0);
  /* the same batch in bf16 (f32's range) does not overflow */
  loom_tensor_free(loss);
  zero_grads(&t);
  loss = tiny_loss(&t, LOOM_AUTOCAST_BF16, 0, 8, NULL);
  LT_OK(loom_backward_amp(loss, s, false));
  g[0].tensor = loom_tensor_grad(t.w);
  g[1].tensor = loom_tensor_grad(t.b);
  LT_OK(loom_amp_prepare_gradients(s, g, 2, true, NULL, &ok));
  LT_TRUE(ok);
  /* check_overflow false: ok regardless */
  LT_OK(loom_scaler_update(s, false));
  LT_OK(loom_tensor_fill(g[0].tensor, INFINITY));
  float v = 1;
  LT_OK(loom_scaler_scale_value(s, &v));
  LT_OK(loom_amp_prepare_gradients(s, g, 2, false, NULL, &ok));
  LT_TRUE(ok);
  LT_ERR(loom_amp_prepare_gradients(s, g, 2, true, NULL, &ok), LOOM_EMISUSE, "already unscaled");
  LT_ERR(loom_amp_prepare_gradients(s, g, 2, true, NULL, NULL), LOOM_EINVAL, "ok is NULL");
  loom_tensor_free(loss);
  loom_scaler_free(s);
  tiny_free(&t);
}

LT_TEST(amp_prepare_converts_to_f32_and_convert_gradients) {
  loom_tensor *a = rand_tensor(LOOM_BF16, 1, (int64_t[]){5}, 4, false);
  loom_tensor *b = rand_tensor(LOOM_F32, 2, (int64_t[]){2, 3}, 4, false);
  loom_tensor *a0 = NULL;
  LT_OK(loom_tensor_clone(a, &a0));
  loom_named_tensor g[3] = {{"a", a}, {"b", b}, {"none", NULL}};
  loom_scaler *s = NULL;
  LT_OK(loom_scaler_create_static(4, &s));
  float v = 1;
  LT_OK(loom_scaler_scale_value(s, &v));
  loom_tensor *f[3];
  bool ok = false;
  LT_OK(loom_amp_prepare_gradients(s, g, 3, true, f, &ok));
  LT_TRUE(ok);
  LT_EQ(loom_tensor_dtype(f[0]), LOOM_F32);
  LT_TRUE(f[1] == b && f[2] == NULL); /* already f32: the same tensor */
  for (size_t i = 0; i < 5; i++) LT_NEAR(at(f[0], i), at(a0, i) / 4, 0); /* exact: 1/4 */
  /* no scaler: conversion only */
  loom_tensor *h[3];
  LT_OK(loom_amp_convert_gradients(g, 3, LOOM_F16, h));
  LT_EQ(loom_tensor_dtype(h[0]), LOOM_F16);
  LT_EQ(loom_tensor_dtype(h[1]), LOOM_F16);
  LT_TRUE(h[2] == NULL);
  loom_tensor_free(h[0]);
  loom_tensor_free(h[1]);
  LT_ERR(loom_amp_convert_gradients(g, 3, LOOM_I32, h), LOOM_EDTYPE, "target dtype i32");
  LT_TRUE(h[0] == NULL);
  for (int i = 0; i < 3; i++) loom_tensor_free(f[i]);
  loom_tensor_free(a0);
  loom_tensor_free(a);
  loom_tensor_free(b);
  loom_scaler_free(s);
}

LT_TEST(amp_gradient_compatibility_names_each_fault) {
  loom_tensor *w = rand_tensor(LOOM_F32, 2, (int64_t[]){4, 3}, 1, true);
  loom_tensor *b = rand_tensor(LOOM_F32, 1, (int64_t[]){4}, 1, true);
  loom_tensor *gw = rand_tensor(LOOM_F32, 2, (int64_t[]){4, 3}, 1, false);
  loom_tensor *gw16 = rand_tensor(LOOM_F16, 2, (int64_t[]){4, 3}, 1, false);
  loom_tensor *gwt = rand_tensor(LOOM_F32, 2, (int64_t[]){3, 4}, 1, false);
  loom_named_tensor p[2] = {{"w", w}, {"b", b}};
  bool ok = false;
  loom_named_tensor g1[1] = {{"w", gw}}; /* b has no gradient: fine */
  LT_OK(loom_amp_ensure_gradient_compatibility(p, 2, g1, 1, &ok));
  LT_TRUE(ok);
  loom_named_tensor g2[1] = {{"w", gw16}};
  LT_ERR(loom_amp_ensure_gradient_compatibility(p, 2, g2, 1, &ok), LOOM_EDTYPE,
         "gradient of 'w' is f16, the parameter is f32");
  LT_TRUE(!ok);
  loom_named_tensor g3[1] = {{"w", gwt}};
  LT_ERR(loom_amp_ensure_gradient_compatibility(p, 2, g3, 1, &ok), LOOM_ESHAPE,
         "gradient of 'w' has shape [3, 4], the parameter [4, 3]");
  loom_named_tensor g4[1] = {{"v", gw}};
  LT_ERR(loom_amp_ensure_gradient_compatibility(p, 2, g4, 1, &ok), LOOM_ENOTFOUND,
         "'v' has no parameter");
  loom_named_tensor g5[2] = {{"w", gw}, {"w", gw}};
  LT_ERR(loom_amp_ensure_gradient_compatibility(p, 2, g5, 2, &ok), LOOM_EINVAL, "appears twice");
  loom_named_tensor g6[1] = {{NULL, gw}};
  LT_ERR(loom_amp_ensure_gradient_compatibility(p, 2, g6, 1, NULL), LOOM_EINVAL, "no name");
  /* a model's own gradients after an autocast backward are always compatible */
  tiny t = tiny_make(5, 8);
  loom_tensor *loss = tiny_loss(&t, LOOM_AUTOCAST_BF16, 0, 8, NULL);
  loom_amp_graph *gr = NULL;
  loom_named_tensor tp[2] = {{"weight", t.w}, {"bias", t.b}}, tg[2];
  LT_OK(loom_amp_graph_create(loss, LOOM_AUTOCAST_BF16, NULL, tp, 2, &gr));
  LT_OK(loom_amp_graph_backward(gr, NULL, tg));
  LT_OK(loom_amp_ensure_gradient_compatibility(tp, 2, tg, 2, &ok));
  LT_TRUE(ok);
  loom_amp_graph_free(gr);
  loom_tensor_free(loss);
  tiny_free(&t);
  loom_tensor_free(w);
  loom_tensor_free(b);
  loom_tensor_free(gw);
  loom_tensor_free(gw16);
  loom_tensor_free(gwt);
}

/* ---- AMP graphs ------------------------------------------------------------------------------- */

LT_TEST(amp_graph_create_and_backward) {
  tiny t = tiny_make(6, 16);
  loom_tensor *loss = tiny_loss(&t, LOOM_AUTOCAST_OFF, 0, 16, NULL);
  LT_OK(loom_backward(loss, NULL, false));
  loom_tensor *rw = clone_grad(t.w);
  loom_tensor_free(loss);
  zero_grads(&t);
  loss = tiny_loss(&t, LOOM_AUTOCAST_F16, 0, 16, NULL);
  loom_named_tensor p[2] = {{"w", t.w}, {"b", t.b}}, g[2];
  loom_amp_graph *gr = NULL;
  LT_OK(loom_amp_graph_create(loss, LOOM_AUTOCAST_F16, NULL, p, 2, &gr));
  loom_amp_context c = loom_amp_graph_context(gr);
  LT_EQ(c.mode, LOOM_AUTOCAST_F16);
  LT_TRUE(!c.needs_unscaling);
  loom_scaler *s = NULL;
  LT_OK(loom_scaler_create_static(256, &s));
  LT_OK(loom_amp_graph_backward(gr, s, g));
  LT_STREQ(g[0].name, "w");
  LT_TRUE(g[0].tensor == loom_tensor_grad(t.w));
  c = loom_amp_graph_context(gr);
  LT_TRUE(c.needs_unscaling && c.scaler == s);
  bool ok = false;
  LT_OK(loom_amp_prepare_gradients_ctx(&c, g, 2, true, NULL, &ok));
  LT_TRUE(ok && !c.needs_unscaling);
  LT_TRUE(rel_err(g[0].tensor, rw, 1) < 4e-3);
  /* prepared again with the context: nothing left to unscale, values unchanged */
  LT_OK(loom_amp_prepare_gradients_ctx(&c, g, 2, true, NULL, &ok));
  LT_TRUE(rel_err(g[0].tensor, rw, 1) < 4e-3);
  /* errors */
  loom_amp_graph *bad = NULL;
  loom_named_tensor dup[2] = {{"w", t.w}, {"w", t.b}};
  LT_ERR(loom_amp_graph_create(loss, LOOM_AUTOCAST_F16, NULL, dup, 2, &bad), LOOM_EINVAL,
         "appears twice");
  LT_TRUE(bad == NULL);
  loom_named_tensor nl[1] = {{"x", t.x}};
  LT_ERR(loom_amp_graph_create(loss, LOOM_AUTOCAST_F16, NULL, nl, 1, &bad), LOOM_EINVAL,
         "not a leaf that requires grad");
  LT_ERR(loom_amp_graph_create(t.x, LOOM_AUTOCAST_F16, NULL, p, 2, &bad), LOOM_EINVAL,
         "does not require grad");
  loom_amp_graph_free(gr);
  loom_amp_graph_free(NULL);
  loom_scaler_free(s);
  loom_tensor_free(loss);
  loom_tensor_free(rw);
  tiny_free(&t);
}

/* ---- accumulation over micro-batches, clipping after unscaling ------------------------------ */

LT_TEST(amp_mixed_precision_gradient_accumulation) {
  tiny t = tiny_make(7, 32);
  loom_tensor *loss = tiny_loss(&t, LOOM_AUTOCAST_OFF, 0, 32, NULL);
  LT_OK(loom_backward(loss, NULL, false));
  loom_tensor *rw = clone_grad(t.w), *rb = clone_grad(t.b);
  loom_tensor_free(loss);
  for (int mode = LOOM_AUTOCAST_F16; mode <= LOOM_AUTOCAST_BF16; mode++) {
    zero_grads(&t);
    loom_scaler *s = NULL;
    LT_OK(loom_scaler_create_dynamic(NULL, &s));
    for (int k = 0; k < 4; k++) { /* 4 micro-batches of 8, each loss divided by 4 */
      loom_tensor *l = tiny_loss(&t, (loom_autocast_mode)mode, 8 * k, 8 * k + 8, NULL), *q = NULL;
      LT_OK(loom_mul_scalar(l, 0.25, &q));
      LT_OK(loom_backward_amp(q, s, false));
      loom_tensor_free(q);
      loom_tensor_free(l);
    }
    loom_tensor *g[2] = {loom_tensor_grad(t.w), loom_tensor_grad(t.b)};
    bool found = true;
    LT_OK(loom_scaler_unscale(s, g, 2, &found)); /* once, after all micro-batches */
    LT_TRUE(!found);
    double tol = mode == LOOM_AUTOCAST_F16 ? 4e-3 : 3e-2;
    LT_TRUE(rel_err(g[0], rw, 1) < tol);
    LT_TRUE(rel_err(g[1], rb, 1) < tol);
    LT_OK(loom_scaler_update(s, found));
    loom_scaler_free(s);
  }
  loom_tensor_free(rw);
  loom_tensor_free(rb);
  tiny_free(&t);
}

LT_TEST(amp_clip_after_unscaling_matches_optim_clipping) {
  rng_state = 8;
  loom_tensor *a = rand_tensor(LOOM_F32, 2, (int64_t[]){16, 8}, 3, false);
  loom_tensor *b = rand_tensor(LOOM_F32, 1, (int64_t[]){8}, 3, false);
  loom_tensor *a2 = NULL, *b2 = NULL;
  LT_OK(loom_tensor_clone(a, &a2));
  LT_OK(loom_tensor_clone(b, &b2));
  /* the amp path: gradients scaled by 1024, unscaled, clipped */
  loom_tensor *g[2] = {a, b};
  loom_scaler *s = NULL;
  LT_OK(loom_scaler_create_static(1024, &s));
  float v = 1;
  LT_OK(loom_scaler_scale_value(s, &v));
  for (int i = 0; i < 2; i++) {
    loom_tensor *m = NULL;
    LT_OK(loom_mul_scalar(g[i], 1024, &m));
    LT_OK(loom_tensor_copy(g[i], m));
    loom_tensor_free(m);
  }
  bool found;
  LT_OK(loom_scaler_unscale(s, g, 2, &found));
  LT_TRUE(!found);
  double norm = 0, norm2 = 0;
  LT_OK(loom_clip_grad_norm_tensors(g, 2, 1.0, false, &norm));
  /* the same clipping of segments over unscaled f32 copies: the same bits (1024 is a power of
   * two, so unscaling is exact) */
  loom_param_seg seg[2] = {{"a", NULL, loom_tensor_data(a2), 128, 0},
                           {"b", NULL, loom_tensor_data(b2), 8, 0}};
  LT_OK(loom_clip_grad_norm(seg, 2, 1.0, false, &norm2));
  LT_TRUE(norm == norm2 && norm > 1); /* it clipped */
  LT_TRUE(memcmp(loom_tensor_data(a), loom_tensor_data(a2), 128 * sizeof(float)) == 0);
  LT_TRUE(memcmp(loom_tensor_data(b), loom_tensor_data(b2), 8 * sizeof(float)) == 0);
  loom_tensor_free(a);
  loom_tensor_free(b);
  loom_tensor_free(a2);
  loom_tensor_free(b2);
  loom_scaler_free(s);
}
