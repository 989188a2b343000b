/* test_autograd.c: the tape and the backward engine: accumulation, retain_graph, the errors
 * (backward twice, non-scalar loss, mismatched grad_output, no grad), no-grad scope, detach,
 * gradient buffers supplied by the caller, hooks (order, count, completeness, removal,
 * errors), queued callbacks, custom functions, long chains, and threads running their own
 * graphs at once. */
#include "lt.h"
#include "core/core_int.h"

#include <pthread.h>
#include <stdlib.h>

static loom_tensor *vec(int64_t n, const float *v) {
  loom_tensor *t = NULL;
  loom_tensor_from_data(LOOM_F32, 1, &n, v, &t);
  return t;
}

static loom_tensor *leaf(int64_t n, const float *v) {
  loom_tensor *t = vec(n, v);
  loom_tensor_set_requires_grad(t, true);
  return t;
}

static double at(const loom_tensor *t, int64_t i) {
  double v = NAN;
  loom_tensor_get(t, &i, &v);
  return v;
}

static size_t compute_bytes(void) {
  loom_pool_stats s;
  loom_mem_stats(LOOM_POOL_COMPUTE, &s);
  return s.current_bytes;
}

/* loss = sum(a * b + a) */
static loom_tensor *diamond(loom_tensor *a, loom_tensor *b) {
  loom_tensor *p = NULL, *q = NULL, *l = NULL;
  loom_mul(a, b, &p);
  loom_add(p, a, &q);
  loom_sum(q, NULL, 0, false, &l);
  loom_tensor_free(p);
  loom_tensor_free(q);
  return l;
}

LT_TEST(autograd_accumulates_and_retains) {
  size_t before = compute_bytes();
  float av[] = {1, 2, 3}, bv[] = {4, 5, 6};
  loom_tensor *a = leaf(3, av), *b = leaf(3, bv);
  loom_tensor *l = diamond(a, b);
  LT_TRUE(loom_tensor_requires_grad(l));
  LT_TRUE(!loom_tensor_is_leaf(l));
  LT_STREQ(loom_tensor_grad_fn_name(l), "sum");
  LT_OK(loom_backward(l, NULL, true));
  for (int i = 0; i < 3; i++) {
    LT_NEAR(at(loom_tensor_grad(a), i), bv[i] + 1, 1e-6);
    LT_NEAR(at(loom_tensor_grad(b), i), av[i], 1e-6);
  }
  LT_OK(loom_backward(l, NULL, false)); /* second pass accumulates */
  for (int i = 0; i < 3; i++) LT_NEAR(at(loom_tensor_grad(a), i), 2 * (bv[i] + 1), 1e-6);
  LT_ERR(loom_backward(l, NULL, false), LOOM_EMISUSE, "already spent");
  LT_ERR(loom_backward(l, NULL, true), LOOM_EMISUSE, "retain_graph");
  for (int i = 0; i < 3; i++) LT_NEAR(at(loom_tensor_grad(a), i), 2 * (bv[i] + 1), 1e-6);
  LT_OK(loom_tensor_zero_grad(a));
  LT_NEAR(at(loom_tensor_grad(a), 1), 0, 0);
  loom_tensor_free(l);
  loom_tensor_free(a);
  loom_tensor_free(b);
  LT_EQ(compute_bytes(), before);
}

LT_TEST(autograd_bad_backward_calls) {
  float v[] = {1, 2, 3};
  loom_tensor *a = leaf(3, v), *c = vec(3, v), *y = NULL, *s = NULL;
  LT_OK(loom_mul_scalar(a, 2.0, &y));
  LT_ERR(loom_backward(y, NULL, false), LOOM_ESHAPE, "pass grad_output");
  int64_t two = 2;
  loom_tensor *g2 = NULL, *gh = NULL;
  LT_OK(loom_tensor_zeros(LOOM_F32, 1, &two, &g2));
  LT_OK(loom_tensor_zeros(LOOM_BF16, 1, (int64_t[]){3}, &gh));
  LT_ERR(loom_backward(y, g2, false), LOOM_ESHAPE, "grad_output shape [2]");
  LT_ERR(loom_backward(y, gh, false), LOOM_EDTYPE, "grad_output dtype bf16");
  LT_OK(loom_sum(c, NULL, 0, false, &s));
  LT_ERR(loom_backward(s, NULL, false), LOOM_EINVAL, "does not require grad");
  LT_ERR(loom_backward(NULL, NULL, false), LOOM_EINVAL, "loom_backward");
  LT_TRUE(loom_tensor_grad(a) == NULL); /* nothing ran */
  loom_tensor *gy = NULL;
  LT_OK(loom_tensor_empty(LOOM_F32, 1, (int64_t[]){3}, &gy));
  LT_OK(loom_tensor_fill(gy, 0.5));
  LT_OK(loom_backward(y, gy, false));
  LT_NEAR(at(loom_tensor_grad(a), 2), 1.0, 1e-6);
  loom_tensor *ints = NULL;
  LT_OK(loom_tensor_zeros(LOOM_I32, 1, &two, &ints));
  LT_ERR(loom_tensor_set_requires_grad(ints, true), LOOM_EDTYPE, "only floating");
  LT_ERR(loom_tensor_set_requires_grad(y, false), LOOM_EMISUSE, "not a leaf");
  LT_ERR(loom_no_grad_exit(), LOOM_EMISUSE, "no matching");
  loom_tensor *tensors[] = {a, c, y, s, g2, gh, gy, ints};
  for (int i = 0; i < 8; i++) loom_tensor_free(tensors[i]);
}

LT_TEST(autograd_no_grad_and_detach) {
  float v[] = {1, -2, 3};
  loom_tensor *a = leaf(3, v), *y = NULL, *d = NULL, *z = NULL;
  loom_no_grad_enter();
  loom_no_grad_enter();
  LT_TRUE(!loom_grad_enabled());
  LT_OK(loom_relu(a, &y));
  LT_OK(loom_no_grad_exit());
  LT_TRUE(!loom_grad_enabled());
  LT_OK(loom_no_grad_exit());
  LT_TRUE(loom_grad_enabled());
  LT_TRUE(!loom_tensor_requires_grad(y));
  LT_TRUE(loom_tensor_is_leaf(y));
  LT_OK(loom_tensor_detach(a, &d));
  LT_TRUE(!loom_tensor_requires_grad(d));
  LT_TRUE(loom_tensor_shares_storage(a, d));
  LT_OK(loom_relu(d, &z));
  LT_TRUE(!loom_tensor_requires_grad(z));
  loom_tensor_free(a);
  loom_tensor_free(y);
  loom_tensor_free(d);
  loom_tensor_free(z);
}

/* ---- hooks ------------------------------------------------------------------------------ */

typedef struct hook_log {
  int order[16];
  double seen[16]; /* the gradient's first element when the hook ran */
  int n;
} hook_log;

typedef struct hook_arg {
  hook_log *log;
  int id;
} hook_arg;

static int log_hook(loom_tensor *grad, void *ctx) {
  hook_arg *h = ctx;
  if (h->log->n < 16) {
    h->log->seen[h->log->n] = at(grad, 0);
    h->log->order[h->log->n++] = h->id;
  }
  return LOOM_OK;
}

/* y = w3 * relu(w2 * relu(w1 * x)) + w1 (w1 used twice: first and last) */
static loom_tensor *chain(loom_tensor *x, loom_tensor **w) {
  loom_tensor *a = NULL, *b = NULL, *c = NULL, *d = NULL, *e = NULL, *f = NULL, *s = NULL;
  loom_mul(w[0], x, &a);
  loom_relu(a, &b);
  loom_mul(w[1], b, &c);
  loom_relu(c, &d);
  loom_mul(w[2], d, &e);
  loom_add(e, w[0], &f);
  loom_sum(f, NULL, 0, false, &s);
  loom_tensor *ts[] = {a, b, c, d, e, f};
  for (int i = 0; i < 6; i++) loom_tensor_free(ts[i]);
  return s;
}

LT_TEST(autograd_hooks_fire_once_in_reverse_order_when_complete) {
  float xv[] = {1, 2}, wv[3][2] = {{0.5f, 1}, {2, 3}, {-1, 4}};
  loom_tensor *x = vec(2, xv), *w[3];
  hook_log log = {0};
  hook_arg args[3];
  for (int i = 0; i < 3; i++) {
    w[i] = leaf(2, wv[i]);
    args[i] = (hook_arg){&log, i};
    LT_OK(loom_tensor_register_hook(w[i], log_hook, &args[i], NULL));
  }
  loom_tensor *l = chain(x, w);
  LT_OK(loom_backward(l, NULL, true));
  LT_EQ(log.n, 3);
  LT_EQ(log.order[0], 2); /* w3 first, then w2, then w1 (complete only after both uses) */
  LT_EQ(log.order[1], 1);
  LT_EQ(log.order[2], 0);
  /* dL/dw1[0] = w3*w2*x (through both relus, all positive) + 1 */
  double g1 = wv[2][0] * wv[1][0] * xv[0] + 1;
  LT_NEAR(log.seen[2], g1, 1e-5);
  LT_NEAR(at(loom_tensor_grad(w[0]), 0), g1, 1e-5);
  LT_OK(loom_backward(l, NULL, false));
  LT_EQ(log.n, 6);
  LT_EQ(log.order[3], 2);
  LT_EQ(log.order[5], 0);
  LT_NEAR(log.seen[5], 2 * g1, 1e-5);
  loom_tensor_free(l);
  for (int i = 0; i < 3; i++) loom_tensor_free(w[i]);
  loom_tensor_free(x);
}

static int failing_hook(loom_tensor *grad, void *ctx) {
  return loom__fail(LOOM_EABORTED, "hook says no");
}

LT_TEST(autograd_hook_removal_and_errors) {
  float v[] = {1, 2};
  loom_tensor *a = leaf(2, v), *c = vec(2, v);
  hook_log log = {0};
  hook_arg arg = {&log, 7};
  int id = 0, id2 = 0;
  LT_OK(loom_tensor_register_hook(a, log_hook, &arg, &id));
  LT_OK(loom_tensor_register_hook(a, log_hook, &arg, &id2));
  LT_OK(loom_tensor_remove_hook(a, id));
  LT_ERR(loom_tensor_remove_hook(a, id), LOOM_ENOTFOUND, "no hook with id");
  LT_ERR(loom_tensor_register_hook(c, log_hook, &arg, NULL), LOOM_EMISUSE,
         "does not require grad");
  LT_ERR(loom_tensor_register_hook(a, NULL, &arg, NULL), LOOM_EINVAL, "fn is NULL");
  loom_tensor *l = NULL;
  LT_OK(loom_sum(a, NULL, 0, false, &l));
  LT_OK(loom_backward(l, NULL, true));
  LT_EQ(log.n, 1);
  LT_OK(loom_tensor_register_hook(a, failing_hook, NULL, NULL));
  LT_ERR(loom_backward(l, NULL, false), LOOM_EABORTED, "hook says no");
  loom_tensor_free(l);
  loom_tensor_free(a);
  loom_tensor_free(c);
}

/* Hooks run phase by phase, in registration order within a phase: a REDUCE hook registered
 * first (DDP made before AMP's checks) still runs after the LOCAL ones, on a leaf and on an
 * op's output; removing one keeps the others' order. */
LT_TEST(autograd_hook_phases_order_hooks_whatever_the_registration_order) {
  float v[] = {1, 2};
  loom_tensor *a = leaf(2, v), *y = NULL, *l = NULL;
  hook_log log = {0};
  hook_arg r1 = {&log, 1}, l2 = {&log, 2}, r3 = {&log, 3}, l4 = {&log, 4};
  int id2 = 0;
  LT_OK(loom_tensor_register_hook_phase(a, LOOM_HOOK_REDUCE, log_hook, &r1, NULL));
  LT_OK(loom_tensor_register_hook(a, log_hook, &l2, &id2));
  LT_OK(loom_tensor_register_hook_phase(a, LOOM_HOOK_REDUCE, log_hook, &r3, NULL));
  LT_OK(loom_tensor_register_hook_phase(a, LOOM_HOOK_LOCAL, log_hook, &l4, NULL));
  LT_ERR(loom_tensor_register_hook_phase(a, (loom_hook_phase)7, log_hook, &l4, NULL), LOOM_EINVAL,
         "not a loom_hook_phase");
  LT_OK(loom_mul_scalar(a, 3.0, &y));
  LT_OK(loom_tensor_register_hook_phase(y, LOOM_HOOK_REDUCE, log_hook, &r1, NULL));
  LT_OK(loom_tensor_register_hook(y, log_hook, &l2, NULL));
  LT_OK(loom_sum(y, NULL, 0, false, &l));
  LT_OK(loom_backward(l, NULL, true));
  int want[] = {2, 1, 2, 4, 1, 3}; /* y: LOCAL 2, REDUCE 1; then a: LOCAL 2, 4, REDUCE 1, 3 */
  LT_EQ(log.n, 6);
  for (int i = 0; i < 6 && i < log.n; i++) LT_EQ(log.order[i], want[i]);
  log.n = 0;
  LT_OK(loom_tensor_remove_hook(a, id2));
  LT_OK(loom_tensor_zero_grad(a));
  LT_OK(loom_backward(l, NULL, false));
  int want2[] = {2, 1, 4, 1, 3};
  LT_EQ(log.n, 5);
  for (int i = 0; i < 5 && i < log.n; i++) LT_EQ(log.order[i], want2[i]);
  loom_tensor_free(l);
  loom_tensor_free(y);
  loom_tensor_free(a);
}

/* ---- gradient buffers, non-leaf hooks, callbacks, custom functions --------------------- */

LT_TEST(autograd_grad_into_caller_buffer) {
  float v[] = {1, 2, 3}, arena[8] = {0};
  loom_tensor *a = leaf(3, v), *buf = NULL, *view = NULL, *l = NULL;
  int64_t n8 = 8;
  LT_OK(loom_tensor_wrap(LOOM_F32, 1, &n8, arena, &buf));
  LT_OK(loom_tensor_narrow(buf, 0, 4, 3, &view)); /* the gradient lives at arena[4..7) */
  LT_OK(loom_tensor_set_grad(a, view));
  LT_TRUE(loom_tensor_grad(a) == view);
  LT_OK(loom_mul(a, a, &l));
  loom_tensor *s = NULL;
  LT_OK(loom_sum(l, NULL, 0, false, &s));
  LT_OK(loom_backward(s, NULL, false));
  for (int i = 0; i < 3; i++) LT_NEAR(arena[4 + i], 2 * v[i], 1e-6);
  LT_NEAR(arena[3], 0, 0);
  LT_NEAR(arena[7], 0, 0);
  loom_tensor *bad = NULL, *badt = NULL, *strided = NULL;
  LT_OK(loom_tensor_zeros(LOOM_F32, 1, (int64_t[]){4}, &bad));
  LT_OK(loom_tensor_zeros(LOOM_BF16, 1, (int64_t[]){3}, &badt));
  LT_OK(loom_tensor_slice(buf, 0, 0, 6, 2, &strided));
  LT_ERR(loom_tensor_set_grad(a, bad), LOOM_ESHAPE, "gradient shape [4]");
  LT_ERR(loom_tensor_set_grad(a, badt), LOOM_EDTYPE, "gradient dtype bf16");
  LT_ERR(loom_tensor_set_grad(a, strided), LOOM_EINVAL, "contiguous");
  LT_ERR(loom_tensor_set_grad(l, view), LOOM_EMISUSE, "not a leaf");
  LT_OK(loom_tensor_set_grad(a, NULL));
  LT_TRUE(loom_tensor_grad(a) == NULL);
  loom_tensor *ts[] = {a, buf, view, l, s, bad, badt, strided};
  for (int i = 0; i < 8; i++) loom_tensor_free(ts[i]);
}

static int double_grad(loom_tensor *grad, void *ctx) {
  int *calls = ctx;
  (*calls)++;
  float *p = loom_tensor_data(grad);
  for (size_t i = 0; i < loom_tensor_numel(grad); i++) p[i] *= 2;
  return LOOM_OK;
}

typedef struct cb_state {
  loom_tensor *a;
  double grad_at_callback;
  int calls;
} cb_state;

static int at_end(void *ctx) {
  cb_state *s = ctx;
  s->calls++;
  s->grad_at_callback = at(loom_tensor_grad(s->a), 0);
  return LOOM_OK;
}

static int queue_from_hook(loom_tensor *grad, void *ctx) {
  return loom_backward_queue_callback(at_end, ctx);
}

LT_TEST(autograd_nonleaf_hook_and_queued_callback) {
  float v[] = {1, 2};
  loom_tensor *a = leaf(2, v), *y = NULL, *z = NULL, *s = NULL;
  int calls = 0;
  cb_state st = {a, 0, 0};
  LT_OK(loom_mul_scalar(a, 3.0, &y));
  LT_OK(loom_tensor_register_hook(y, double_grad, &calls, NULL)); /* on an op output */
  LT_OK(loom_tensor_register_hook(a, queue_from_hook, &st, NULL));
  LT_OK(loom_tanh(y, &z));
  LT_OK(loom_sum(z, NULL, 0, false, &s));
  LT_ERR(loom_backward_queue_callback(at_end, &st), LOOM_EMISUSE, "no backward is running");
  LT_OK(loom_backward(s, NULL, false));
  LT_EQ(calls, 1);
  LT_EQ(st.calls, 1);
  double t = tanh(3.0), want = 2 * 3 * (1 - t * t);
  LT_NEAR(at(loom_tensor_grad(a), 0), want, 1e-5);
  LT_NEAR(st.grad_at_callback, want, 1e-5);
  loom_tensor *ts[] = {a, y, z, s};
  for (int i = 0; i < 4; i++) loom_tensor_free(ts[i]);
}

typedef struct cube_ctx {
  loom_tensor *x; /* saved input (detached) */
  int *freed;
} cube_ctx;

static int cube_bwd(void *ctx, loom_tensor *gout, int n_in, const bool *needs,
                    loom_tensor **gin) {
  cube_ctx *c = ctx;
  if (!needs[0]) return LOOM_OK;
  int rc = loom_tensor_empty(LOOM_F32, loom_tensor_ndim(c->x), loom_tensor_shape(c->x), &gin[0]);
  if (rc) return rc;
  const float *x = loom_tensor_data(c->x), *g = loom_tensor_data(gout);
  float *d = loom_tensor_data(gin[0]);
  for (size_t i = 0; i < loom_tensor_numel(c->x); i++) d[i] = 3 * x[i] * x[i] * g[i];
  return LOOM_OK;
}

static void cube_free(void *ctx) {
  cube_ctx *c = ctx;
  (*c->freed)++;
  loom_tensor_free(c->x);
  free(c);
}

LT_TEST(autograd_custom_function) {
  float v[] = {1, -2, 0.5f};
  loom_tensor *a = leaf(3, v), *y = NULL, *s = NULL;
  int freed = 0;
  loom_no_grad_enter();
  LT_OK(loom_pow(a, 3.0, &y));
  loom_no_grad_exit();
  cube_ctx *c = malloc(sizeof *c);
  c->freed = &freed;
  LT_OK(loom_tensor_detach(a, &c->x));
  loom_tensor *ins[] = {a};
  LT_OK(loom_autograd_record_custom("cube", ins, 1, y, cube_bwd, c, cube_free));
  LT_STREQ(loom_tensor_grad_fn_name(y), "cube");
  LT_ERR(loom_autograd_record_custom("again", ins, 1, y, cube_bwd, NULL, NULL), LOOM_EMISUSE,
         "already part of a graph");
  LT_OK(loom_sum(y, NULL, 0, false, &s));
  LT_OK(loom_backward(s, NULL, false));
  for (int i = 0; i < 3; i++) LT_NEAR(at(loom_tensor_grad(a), i), 3 * v[i] * v[i], 1e-6);
  LT_EQ(freed, 1); /* spent by backward without retain_graph */
  loom_tensor_free(s);
  loom_tensor_free(y);
  loom_tensor_free(a);
}

LT_TEST(autograd_long_chain_is_iterative) {
  float v[] = {1};
  loom_tensor *a = leaf(1, v), *x = loom_tensor_retain(a);
  for (int i = 0; i < 100000; i++) {
    loom_tensor *y = NULL;
    LT_OK(loom_add_scalar(x, 1e-6, &y));
    loom_tensor_free(x);
    x = y;
  }
  LT_OK(loom_backward(x, NULL, true));
  LT_NEAR(at(loom_tensor_grad(a), 0), 1.0, 1e-6);
  loom_tensor_free(x); /* frees 100000 nodes without recursion */
  loom_tensor_free(a);
}

/* ---- threads: every thread trains its own copy; results equal the sequential ones ------- */

static void *worker(void *p) {
  double *out = p;
  float wv[64], xv[64];
  for (int i = 0; i < 64; i++) wv[i] = (float)(i % 7) * 0.1f, xv[i] = (float)(i % 5) * 0.2f;
  loom_tensor *w = leaf(64, wv), *x = vec(64, xv);
  hook_log log = {0};
  hook_arg arg = {&log, 1};
  loom_tensor_register_hook(w, log_hook, &arg, NULL);
  for (int step = 0; step < 50; step++) {
    loom_tensor *l = chain(x, (loom_tensor *[]){w, w, w});
    loom_backward(l, NULL, false);
    loom_tensor_free(l);
  }
  *out = at(loom_tensor_grad(w), 3) + 1000 * log.n;
  loom_tensor_free(w);
  loom_tensor_free(x);
  return NULL;
}

LT_TEST(autograd_threads_run_their_own_graphs) {
  double seq, par[4];
  worker(&seq);
  pthread_t th[4];
  for (int i = 0; i < 4; i++) pthread_create(&th[i], NULL, worker, &par[i]);
  for (int i = 0; i < 4; i++) pthread_join(th[i], NULL);
  for (int i = 0; i < 4; i++) LT_EQ(par[i], seq);
}
