/* test_grad_sinks.c: backward functions writing straight into f32 leaf gradients (sinks,
 * autograd_int.h): linear and matmul weight and bias gradients against hand references when a
 * weight is used twice, with retain_graph (+=), after zero_grad and after set_grad(NULL) (the
 * first write overwrites a fresh buffer), into a caller's buffer that is a view of a larger
 * one (as DDP buckets are), through the cached autocast cast of an f32 master weight and past
 * an explicit cast; a leaf's hook fires once, with the complete gradient; a hook on a cast's
 * output still sees its gradient; a backward that fails part-way leaves no half-written
 * gradient; zero_grad_lazy: the next write overwrites the kept buffer (sinks, an op without one,
 * autocast), loom_tensor_grad (a pure getter) writes nothing while loom_tensor_settle_grad
 * writes an unwritten one's zeros, and a failed backward leaves it zero or complete. */
#include "lt.h"
#include "loom/autocast.h"

#include <string.h>

enum { R = 3, I = 4, O = 2 };

/* Small integers and halves: exact in bf16, so the bf16 path gives the same sums. */
static const float xv[R * I] = {1, 2, -1, 0.5f, 0, 3, 1, -2, 2, -0.5f, 1, 1};
static const float x2v[R * I] = {-1, 1, 2, 0, 1, 1, -2, 0.5f, 0.5f, 2, 0, -1};
static const float wv[O * I] = {0.5f, -1, 2, 0.25f, 1, -0.5f, 0, 1};
static const float bv[O] = {0.5f, -1};
static const float cv[R * O] = {1, 2, -1, 0.5f, 3, -2}; /* loss = sum(y * c) */

static loom_tensor *mk(int ndim, const int64_t *shape, const float *v, bool grad) {
  loom_tensor *t = NULL;
  loom_tensor_from_data(LOOM_F32, ndim, shape, v, &t);
  if (grad) loom_tensor_set_requires_grad(t, true);
  return t;
}

/* Expected gradients of sum(linear(x, W, b) * c) summed over `uses` inputs. */
static void expect(const float *const *xs, int uses, float *gw, float *gb) {
  memset(gw, 0, O * I * sizeof *gw);
  memset(gb, 0, O * sizeof *gb);
  for (int u = 0; u < uses; u++)
    for (int r = 0; r < R; r++)
      for (int o = 0; o < O; o++) {
        gb[o] += cv[r * O + o];
        for (int i = 0; i < I; i++) gw[o * I + i] += cv[r * O + o] * xs[u][r * I + i];
      }
}

/* loss = sum over inputs of sum(linear(x, w, b) * c). */
static loom_tensor *loss_of(loom_tensor *const *xs, int uses, loom_tensor *w, loom_tensor *b,
                            loom_tensor *c) {
  loom_tensor *total = NULL;
  for (int u = 0; u < uses; u++) {
    loom_tensor *y = NULL, *p = NULL, *s = NULL, *t = NULL;
    loom_linear(xs[u], w, b, &y);
    loom_mul(y, c, &p);
    loom_sum(p, NULL, 0, false, &s);
    if (total) {
      loom_add(total, s, &t);
      loom_tensor_free(total);
      loom_tensor_free(s);
      total = t;
    } else {
      total = s;
    }
    loom_tensor_free(y);
    loom_tensor_free(p);
  }
  return total;
}

static void check_grad(const loom_tensor *t, const float *want, int n, float scale, double tol) {
  const loom_tensor *g = loom_tensor_grad(t);
  LT_TRUE(g != NULL);
  LT_EQ(loom_tensor_dtype(g), LOOM_F32);
  const float *p = loom_tensor_data(g);
  for (int i = 0; i < n; i++) LT_NEAR(p[i], scale * want[i], tol);
}

/* A hook that counts its calls and keeps a copy of the gradient it was given. */
typedef struct seen {
  int calls;
  float v[O * I];
} seen;

static int keep(loom_tensor *grad, void *ctx) {
  seen *s = ctx;
  s->calls++;
  size_t n = loom_tensor_numel(grad);
  memcpy(s->v, loom_tensor_data(grad), (n < O * I ? n : O * I) * sizeof(float));
  return LOOM_OK;
}

/* A weight and bias used by two linears, with the expected gradients. */
typedef struct two_uses {
  loom_tensor *x, *x2, *w, *b, *c, *xs[2];
  float gw[O * I], gb[O];
} two_uses;

static void two_uses_init(two_uses *f) {
  f->x = f->xs[0] = mk(2, (int64_t[]){R, I}, xv, false);
  f->x2 = f->xs[1] = mk(2, (int64_t[]){R, I}, x2v, false);
  f->w = mk(2, (int64_t[]){O, I}, wv, true);
  f->b = mk(1, (int64_t[]){O}, bv, true);
  f->c = mk(2, (int64_t[]){R, O}, cv, false);
  const float *xp[2] = {xv, x2v};
  expect(xp, 2, f->gw, f->gb);
}

LT_TEST(sinks_linear_weight_used_twice_accumulates_and_hook_sees_all) {
  two_uses f;
  two_uses_init(&f);
  loom_tensor *x = f.x, *x2 = f.x2, *w = f.w, *b = f.b, *c = f.c, **xs = f.xs;
  const float *gw = f.gw, *gb = f.gb;
  seen sw = {0};
  LT_OK(loom_tensor_register_hook(w, keep, &sw, NULL));
  loom_tensor *l = loss_of(xs, 2, w, b, c);
  LT_OK(loom_backward(l, NULL, true));
  LT_EQ(sw.calls, 1);
  for (int i = 0; i < O * I; i++) LT_NEAR(sw.v[i], gw[i], 1e-5); /* complete when it fired */
  check_grad(w, gw, O * I, 1, 1e-5);
  check_grad(b, gb, O, 1, 1e-5);
  LT_OK(loom_backward(l, NULL, false)); /* retain_graph: the second pass adds */
  LT_EQ(sw.calls, 2);
  check_grad(w, gw, O * I, 2, 1e-5);
  check_grad(b, gb, O, 2, 1e-5);
  loom_tensor_free(l);

  LT_OK(loom_tensor_zero_grad(w)); /* kept buffer, zeroed: += from zero */
  LT_OK(loom_tensor_set_grad(b, NULL)); /* no buffer: the first write makes it */
  const loom_tensor *kept = loom_tensor_grad(w);
  l = loss_of(xs, 2, w, b, c);
  LT_OK(loom_backward(l, NULL, false));
  LT_TRUE(loom_tensor_grad(w) == kept);
  check_grad(w, gw, O * I, 1, 1e-5);
  check_grad(b, gb, O, 1, 1e-5);
  loom_tensor *ts[] = {x, x2, w, b, c, l};
  for (int i = 0; i < 6; i++) loom_tensor_free(ts[i]);
}

LT_TEST(sinks_write_into_a_view_of_a_caller_buffer) {
  float arena[2 + O * I + 2];
  for (int i = 0; i < 2 + O * I + 2; i++) arena[i] = i >= 2 && i < 2 + O * I ? 1.0f : 7.0f;
  loom_tensor *x = mk(2, (int64_t[]){R, I}, xv, false), *w = mk(2, (int64_t[]){O, I}, wv, true);
  loom_tensor *c = mk(2, (int64_t[]){R, O}, cv, false), *buf = NULL, *flat = NULL, *view = NULL;
  int64_t n = 2 + O * I + 2;
  LT_OK(loom_tensor_wrap(LOOM_F32, 1, &n, arena, &buf));
  LT_OK(loom_tensor_narrow(buf, 0, 2, O * I, &flat));
  LT_OK(loom_tensor_reshape(flat, 2, (int64_t[]){O, I}, &view));
  LT_OK(loom_tensor_set_grad(w, view)); /* holds 1.0 everywhere: backward adds to it */
  const float *xp[1] = {xv};
  float gw[O * I], gb[O];
  expect(xp, 1, gw, gb);
  loom_tensor *l = loss_of(&x, 1, w, NULL, c);
  LT_OK(loom_backward(l, NULL, false));
  LT_TRUE(loom_tensor_grad(w) == view);
  for (int i = 0; i < O * I; i++) LT_NEAR(arena[2 + i], 1.0f + gw[i], 1e-5);
  for (int i = 0; i < 2; i++) {
    LT_NEAR(arena[i], 7.0f, 0);
    LT_NEAR(arena[2 + O * I + i], 7.0f, 0);
  }
  loom_tensor *ts[] = {x, w, c, buf, flat, view, l};
  for (int i = 0; i < 7; i++) loom_tensor_free(ts[i]);
}

LT_TEST(sinks_through_the_autocast_cast_of_a_master_weight) {
  two_uses f;
  two_uses_init(&f);
  loom_tensor *x = f.x, *x2 = f.x2, *w = f.w, *b = f.b, *c = f.c, **xs = f.xs;
  const float *gw = f.gw, *gb = f.gb;
  seen sw = {0}, sb = {0};
  LT_OK(loom_tensor_register_hook(w, keep, &sw, NULL));
  LT_OK(loom_tensor_register_hook(b, keep, &sb, NULL));
  loom_autocast_token tok;
  LT_OK(loom_autocast_enter(LOOM_AUTOCAST_BF16, NULL, &tok));
  loom_tensor *l = loss_of(xs, 2, w, b, c); /* w and b cast once, used twice */
  LT_OK(loom_autocast_exit(&tok));
  LT_OK(loom_backward(l, NULL, false));
  LT_EQ(sw.calls, 1);
  LT_EQ(sb.calls, 1);
  for (int i = 0; i < O * I; i++) LT_NEAR(sw.v[i], gw[i], 1e-5);
  check_grad(w, gw, O * I, 1, 1e-5); /* exact: every value and product fits bf16 and f32 */
  check_grad(b, gb, O, 1, 1e-5);
  loom_tensor *ts[] = {x, x2, w, b, c, l};
  for (int i = 0; i < 6; i++) loom_tensor_free(ts[i]);
}

LT_TEST(sinks_do_not_bypass_a_hook_on_a_cast) {
  loom_tensor *x = mk(2, (int64_t[]){R, I}, xv, false), *w = mk(2, (int64_t[]){O, I}, wv, true);
  loom_tensor *c = mk(2, (int64_t[]){R, O}, cv, false), *xb = NULL, *wb = NULL, *cb = NULL;
  LT_OK(loom_tensor_cast(x, LOOM_BF16, &xb));
  LT_OK(loom_tensor_cast(c, LOOM_BF16, &cb));
  LT_OK(loom_cast(w, LOOM_BF16, &wb));
  seen sc = {0}, sw = {0};
  LT_OK(loom_tensor_register_hook(wb, keep, &sc, NULL));
  LT_OK(loom_tensor_register_hook(w, keep, &sw, NULL));
  const float *xp[1] = {xv};
  float gw[O * I], gb[O];
  expect(xp, 1, gw, gb);
  loom_tensor *l = loss_of(&xb, 1, wb, NULL, cb);
  LT_OK(loom_backward(l, NULL, false));
  LT_EQ(sc.calls, 1);
  LT_EQ(sw.calls, 1);
  for (int i = 0; i < O * I; i++) LT_NEAR(sc.v[i], gw[i], 1e-5);
  check_grad(w, gw, O * I, 1, 1e-5);
  loom_tensor *ts[] = {x, w, c, xb, wb, cb, l};
  for (int i = 0; i < 7; i++) loom_tensor_free(ts[i]);
}

LT_TEST(sinks_matmul_with_one_leaf_on_both_sides) {
  enum { N = 3 };
  const float av[N * N] = {1, 2, 0, -1, 0.5f, 3, 2, 1, -2}, gv[N * N] = {1, -1, 2, 0, 3, 1, -2, 1, 1};
  loom_tensor *a = mk(2, (int64_t[]){N, N}, av, true), *g = mk(2, (int64_t[]){N, N}, gv, false);
  loom_tensor *p = NULL, *q = NULL, *l = NULL;
  LT_OK(loom_matmul(a, a, &p));
  LT_OK(loom_mul(p, g, &q));
  LT_OK(loom_sum(q, NULL, 0, false, &l));
  LT_OK(loom_backward(l, NULL, false));
  float want[N * N] = {0}; /* d sum(G .* AA) / dA = G A^T + A^T G */
  for (int i = 0; i < N; i++)
    for (int j = 0; j < N; j++)
      for (int k = 0; k < N; k++)
        want[i * N + j] += gv[i * N + k] * av[j * N + k] + av[k * N + i] * gv[k * N + j];
  check_grad(a, want, N * N, 1, 1e-5);
  loom_tensor *ts[] = {a, g, p, q, l};
  for (int i = 0; i < 5; i++) loom_tensor_free(ts[i]);
}

/* Backward with allocation nth failing, for nth = 1, 2, ...: each gradient must then be
 * complete or as it was before, never partly written; with 2 uses the weight and bias get
 * contributions from two linears; once the weight's hook has run, its gradient stays complete
 * even if backward fails after that. Before it, with `lazy`, a backward of another loss fills the
 * gradients with other values and zero_grad_lazy zeroes them ("as before" is all zeros). */
static void failure_sweep(bool lazy, int uses) {
  two_uses f;
  two_uses_init(&f);
  LT_OK(loom_tensor_set_requires_grad(f.x, true)); /* linear then allocates x's gradient after */
  LT_OK(loom_tensor_set_requires_grad(f.x2, true)); /* it finished (and hooked) w and b */
  const float *xp[2] = {xv, x2v};
  float gw[O * I], gb[O];
  expect(xp, uses, gw, gb);
  const float zeros[O * I] = {0};
  int failures = 0;
  for (uint64_t nth = 1; nth < 60; nth++) {
    loom_tensor *w = mk(2, (int64_t[]){O, I}, wv, true), *b = mk(1, (int64_t[]){O}, bv, true);
    if (lazy) {
      loom_tensor *l0 = loss_of(&f.x2, 1, w, b, f.c);
      LT_OK(loom_backward(l0, NULL, false)); /* buffers with other values than gw, gb */
      loom_tensor_free(l0);
      LT_OK(loom_tensor_zero_grad_lazy(w));
      LT_OK(loom_tensor_zero_grad_lazy(b));
    }
    seen sw = {0};
    LT_OK(loom_tensor_register_hook(w, keep, &sw, NULL));
    loom_tensor *l = loss_of(f.xs, uses, w, b, f.c);
    LT_TRUE(l != NULL);
    loom_alloc_fail_nth(nth);
    int rc = loom_backward(l, NULL, false);
    loom_alloc_fail_nth(0);
    if (rc) {
      failures++;
      LT_EQ(rc, LOOM_ENOMEM);
    }
    if (lazy) { /* complete, or still zero */
      LT_OK(loom_tensor_settle_grad(w));
      LT_OK(loom_tensor_settle_grad(b));
      const float *pw = loom_tensor_data(loom_tensor_grad(w)), *pb = loom_tensor_data(loom_tensor_grad(b));
      if (memcmp(pw, zeros, sizeof gw) != 0) check_grad(w, gw, O * I, 1, 1e-5);
      if (memcmp(pb, zeros, sizeof gb) != 0) check_grad(b, gb, O, 1, 1e-5);
    } else { /* absent or complete */
      if (loom_tensor_grad(w)) check_grad(w, gw, O * I, 1, 1e-5);
      if (loom_tensor_grad(b)) check_grad(b, gb, O, 1, 1e-5);
    }
    if (!rc || sw.calls) /* a gradient its hook has seen stays, whatever fails later */
      check_grad(w, gw, O * I, 1, 1e-5);
    if (!rc) check_grad(b, gb, O, 1, 1e-5);
    loom_tensor *ts[] = {w, b, l};
    for (int i = 0; i < 3; i++) loom_tensor_free(ts[i]);
  }
  LT_TRUE(failures > 0);
  loom_tensor *ts[] = {f.x, f.x2, f.w, f.b, f.c};
  for (int i = 0; i < 5; i++) loom_tensor_free(ts[i]);
}

LT_TEST(sinks_failed_backward_leaves_no_half_written_gradient) { failure_sweep(false, 1); }

/* Hooks that log which leaf fired, in order. */
typedef struct order_log {
  int n;
  char who[8];
} order_log;
typedef struct order_hook {
  order_log *log;
  char name;
} order_hook;
static int log_order(loom_tensor *grad, void *ctx) {
  (void)grad;
  order_hook *h = ctx;
  if (h->log->n < 8) h->log->who[h->log->n++] = h->name;
  return LOOM_OK;
}

/* linear finishes the weight and bias gradients it writes before it computes its input's: their
 * hooks fire first (with complete gradients), then the input's; used twice, a weight fires
 * once, after its last use. */
LT_TEST(sinks_linear_finishes_parameter_gradients_before_the_input_gradient) {
  two_uses f;
  two_uses_init(&f);
  LT_OK(loom_tensor_set_requires_grad(f.x, true));
  order_log log = {0};
  order_hook hx = {&log, 'x'}, hw = {&log, 'w'}, hb = {&log, 'b'};
  LT_OK(loom_tensor_register_hook(f.x, log_order, &hx, NULL));
  LT_OK(loom_tensor_register_hook(f.w, log_order, &hw, NULL));
  LT_OK(loom_tensor_register_hook(f.b, log_order, &hb, NULL));
  loom_tensor *l = loss_of(f.xs, 1, f.w, f.b, f.c);
  LT_OK(loom_backward(l, NULL, false));
  LT_EQ(log.n, 3);
  LT_TRUE(memcmp(log.who, "bwx", 3) == 0);
  const float *xp[1] = {xv};
  expect(xp, 1, f.gw, f.gb);
  check_grad(f.w, f.gw, O * I, 1, 1e-5);
  check_grad(f.b, f.gb, O, 1, 1e-5);
  loom_tensor_free(l);
  /* two uses: w and b fire once each, when their last use has written them; x once */
  log.n = 0;
  LT_OK(loom_tensor_zero_grad(f.w));
  LT_OK(loom_tensor_zero_grad(f.b));
  l = loss_of(f.xs, 2, f.w, f.b, f.c);
  LT_OK(loom_backward(l, NULL, false));
  LT_EQ(log.n, 3);
  int nw = 0, nb = 0;
  for (int i = 0; i < log.n; i++) nw += log.who[i] == 'w', nb += log.who[i] == 'b';
  LT_EQ(nw, 1);
  LT_EQ(nb, 1);
  const float *xp2[2] = {xv, x2v};
  expect(xp2, 2, f.gw, f.gb);
  check_grad(f.w, f.gw, O * I, 1, 1e-5);
  loom_tensor_free(l);
  loom_tensor *ts[] = {f.x, f.x2, f.w, f.b, f.c};
  for (int i = 0; i < 5; i++) loom_tensor_free(ts[i]);
}

/* A raw look at a gradient buffer: its memory, whatever a pending lazy zero says. */
static const float *raw(const loom_tensor *g) { return loom_tensor_data(g); }

/* zero_grad_lazy: the next backward overwrites the kept buffer, through linear's sinks (weight
 * used twice: the first write overwrites, the second adds), through an op without a sink (mul's
 * temporary is copied in), and through autocast's cast of the master weight; a hook sees the
 * complete gradient; the buffers stay the same objects. */
LT_TEST(lazy_zero_next_backward_overwrites_the_kept_buffer) {
  two_uses f;
  two_uses_init(&f);
  loom_tensor *w = f.w, *b = f.b, *c = f.c, **xs = f.xs;
  const int64_t sshape[] = {O};
  loom_tensor *s = mk(1, sshape, (float[]){2, -3}, true); /* reached only through mul */
  seen sw = {0};
  LT_OK(loom_tensor_register_hook(w, keep, &sw, NULL));
  const loom_tensor *kw = NULL, *kb = NULL, *ks = NULL; /* the buffers */
  for (int round = 0; round < 3; round++) {
    loom_autocast_token tok;
    LT_OK(loom_autocast_enter(round == 2 ? LOOM_AUTOCAST_BF16 : LOOM_AUTOCAST_OFF, NULL, &tok));
    loom_tensor *l = loss_of(xs, 2, w, b, c), *bs = NULL, *ls = NULL, *l2 = NULL;
    LT_OK(loom_autocast_exit(&tok));
    LT_OK(loom_mul(b, s, &bs)); /* + sum(b * s): s's gradient is b, b's gains s */
    LT_OK(loom_sum(bs, NULL, 0, false, &ls));
    LT_OK(loom_add(l, ls, &l2));
    LT_OK(loom_backward(l2, NULL, false));
    if (round > 0) { /* the same buffers as before */
      LT_TRUE(loom_tensor_grad(w) == kw && loom_tensor_grad(b) == kb && loom_tensor_grad(s) == ks);
    }
    float gb[O] = {f.gb[0] + 2, f.gb[1] - 3};
    LT_EQ(sw.calls, round + 1);
    for (int i = 0; i < O * I; i++) LT_NEAR(sw.v[i], f.gw[i], 1e-5);
    check_grad(w, f.gw, O * I, 1, 1e-5);
    check_grad(b, gb, O, 1, 1e-5);
    check_grad(s, bv, O, 1, 1e-5);
    /* lazily zeroed: nothing written, the old values still in memory */
    kw = loom_tensor_grad(w);
    kb = loom_tensor_grad(b);
    ks = loom_tensor_grad(s);
    LT_OK(loom_tensor_zero_grad_lazy(w));
    LT_OK(loom_tensor_zero_grad_lazy(b));
    LT_OK(loom_tensor_zero_grad_lazy(s));
    LT_NEAR(raw(kw)[0], f.gw[0], 1e-5);
    loom_tensor *ts[] = {l, bs, ls, l2};
    for (int i = 0; i < 4; i++) loom_tensor_free(ts[i]);
  }
  loom_tensor *ts[] = {f.x, f.x2, w, b, c, s};
  for (int i = 0; i < 6; i++) loom_tensor_free(ts[i]);
}

/* A leaf that the next backward does not reach reads as zeros once settled, in its same
 * buffer, and loom_tensor_grad alone writes nothing; one it reaches with no gradient flowing (a
 * node skipped) too; zero_grad_lazy on a leaf without a buffer does nothing; settle is a no-op
 * without a pending lazy zero; loom_tensor_zero_grad and set_grad end a pending lazy zero. */
LT_TEST(lazy_zero_reads_as_zero_when_backward_does_not_write) {
  loom_tensor *x = mk(2, (int64_t[]){R, I}, xv, false), *c = mk(2, (int64_t[]){R, O}, cv, false);
  loom_tensor *w = mk(2, (int64_t[]){O, I}, wv, true), *b = mk(1, (int64_t[]){O}, bv, true);
  LT_OK(loom_tensor_zero_grad_lazy(w)); /* no buffer yet: nothing to do */
  LT_TRUE(loom_tensor_grad(w) == NULL);
  loom_tensor *l = loss_of(&x, 1, w, b, c);
  LT_OK(loom_backward(l, NULL, false));
  loom_tensor_free(l);
  const loom_tensor *gw = loom_tensor_grad(w), *gb = loom_tensor_grad(b);
  LT_TRUE(gw && gb && raw(gw)[0] != 0.0f && raw(gb)[0] != 0.0f);
  LT_OK(loom_tensor_zero_grad_lazy(w));
  LT_OK(loom_tensor_zero_grad_lazy(b));
  LT_TRUE(raw(gw)[0] != 0.0f); /* not written yet */
  /* a backward that reaches b only */
  loom_tensor *bs = NULL;
  LT_OK(loom_sum(b, NULL, 0, false, &bs));
  LT_OK(loom_backward(bs, NULL, false));
  loom_tensor_free(bs);
  const float ones[O * I] = {1, 1, 1, 1, 1, 1, 1, 1}, zeros[O * I] = {0};
  check_grad(b, ones, O, 1, 0); /* overwritten, not added to the old values */
  LT_TRUE(loom_tensor_grad(w) == gw);
  LT_TRUE(raw(gw)[0] != 0.0f); /* the getter wrote nothing: the old values are still there */
  LT_OK(loom_tensor_settle_grad(w));
  check_grad(w, zeros, O * I, 1, 0); /* settled: the zeros are written now */
  LT_OK(loom_tensor_settle_grad(b)); /* nothing pending: b keeps what backward wrote */
  check_grad(b, ones, O, 1, 0);
  LT_OK(loom_tensor_settle_grad(x)); /* no gradient at all: nothing to do */
  LT_ERR(loom_tensor_settle_grad(NULL), LOOM_EINVAL, "");
  loom_grad_bound_kind kind;
  double bound = -1;
  LT_OK(loom_tensor_grad_bound(w, &kind, &bound));
  LT_EQ(kind, LOOM_GRAD_BOUND_FINITE);
  LT_NEAR(bound, 0, 0);
  /* explicit zeroing and set_grad end the lazy state */
  LT_OK(loom_tensor_zero_grad_lazy(b));
  LT_OK(loom_tensor_zero_grad(b));
  check_grad(b, zeros, O, 1, 0);
  LT_OK(loom_tensor_zero_grad_lazy(b));
  loom_tensor *mine = mk(1, (int64_t[]){O}, (float[]){5, 6}, false);
  LT_OK(loom_tensor_set_grad(b, mine));
  check_grad(b, (float[]){5, 6}, O, 1, 0); /* the caller's values, not zeros */
  LT_ERR(loom_tensor_zero_grad_lazy(NULL), LOOM_EINVAL, "");
  loom_tensor *ts[] = {x, c, w, b, mine};
  for (int i = 0; i < 5; i++) loom_tensor_free(ts[i]);
}

/* A backward that fails part-way after lazy zeroing leaves each gradient either complete or
 * still (logically) zero, never half overwritten. */
LT_TEST(lazy_zero_failed_backward_leaves_zero_or_complete) {
  failure_sweep(true, 1);
  failure_sweep(true, 2); /* two linears write the same leaves */
}
