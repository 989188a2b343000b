/* test_amp_train.c: training an MLP (linear-relu-linear, cross entropy, SGD) under autocast:
 * f16 with dynamic loss scaling, where an injected inf gradient and an input that overflows f16
 * each skip exactly their step (parameters bit-identical across it) and halve the scale; and
 * bf16, whose loss curve stays within a stated tolerance of the f32 curve; and the fast steps
 * (unscale from the gradient hooks, the deferred unscale with loom_scaler_check or the checking
 * hooks plus loom_optim_step_scaled, with and without clipping) bit-identical to the separate
 * unscale pass. */
#include "lt.h"
#include "amp/amp_int.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

enum { IN = 32, HID = 64, OUT = 4, BATCH = 64, NPARAM = 4 };

typedef struct mlp {
  loom_tensor *p[NPARAM]; /* w1 [HID, IN], b1 [HID], w2 [OUT, HID], b2 [OUT], f32 leaves */
  loom_tensor *g[NPARAM]; /* their gradient buffers */
  loom_optim *opt;
} mlp;

static uint64_t rs;
static float urand(void) {
  rs = rs * 6364136223846793005ull + 1442695040888963407ull;
  return (float)((rs >> 40) * (1.0 / 16777216.0)) * 2.0f - 1.0f;
}

static void mlp_init(mlp *m, uint64_t seed) {
  static const int64_t shapes[NPARAM][2] = {{HID, IN}, {HID, 0}, {OUT, HID}, {OUT, 0}};
  static const float bound[NPARAM] = {0.17f, 0.17f, 0.125f, 0.125f}; /* 1/sqrt(fan_in) */
  rs = seed;
  loom_param_seg seg[NPARAM];
  for (int i = 0; i < NPARAM; i++) {
    int nd = shapes[i][1] ? 2 : 1;
    LT_OK(loom_tensor_empty(LOOM_F32, nd, shapes[i], &m->p[i]));
    float *v = loom_tensor_data(m->p[i]);
    for (size_t j = 0; j < loom_tensor_numel(m->p[i]); j++) v[j] = bound[i] * urand();
    LT_OK(loom_tensor_set_requires_grad(m->p[i], true));
    LT_OK(loom_tensor_zeros(LOOM_F32, nd, shapes[i], &m->g[i]));
    LT_OK(loom_tensor_set_grad(m->p[i], m->g[i]));
    seg[i] = (loom_param_seg){NULL, v, loom_tensor_data(m->g[i]), loom_tensor_numel(m->p[i]), 0};
  }
  loom_sgd_cfg c = loom_sgd_cfg_default();
  c.lr = 0.2;
  LT_OK(loom_optim_create_sgd(seg, NPARAM, &c, &m->opt));
}

static void mlp_free(mlp *m) {
  loom_optim_free(m->opt);
  for (int i = 0; i < NPARAM; i++) {
    loom_tensor_free(m->p[i]);
    loom_tensor_free(m->g[i]);
  }
}

/* Batch k of a fixed synthetic task: x uniform, label = argmax of a fixed teacher projection. */
static void batch(int k, loom_tensor **x, loom_tensor **y) {
  float xv[BATCH * IN];
  int64_t yv[BATCH];
  rs = 1000 + (uint64_t)k;
  for (int i = 0; i < BATCH * IN; i++) xv[i] = urand();
  for (int r = 0; r < BATCH; r++) {
    int best = 0;
    float bv = -1e30f;
    for (int c = 0; c < OUT; c++) {
      float s = 0;
      for (int j = 0; j < IN; j++) s += xv[r * IN + j] * (float)(((j * 7 + c * 13) % 5) - 2);
      if (s > bv) bv = s, best = c;
    }
    yv[r] = best;
  }
  LT_OK(loom_tensor_from_data(LOOM_F32, 2, (int64_t[]){BATCH, IN}, xv, x));
  LT_OK(loom_tensor_from_data(LOOM_I64, 1, (int64_t[]){BATCH}, yv, y));
}

static loom_tensor *forward(mlp *m, loom_tensor *x, loom_tensor *y, loom_autocast_mode mode) {
  loom_autocast_token tok;
  loom_tensor *h = NULL, *a = NULL, *lg = NULL, *loss = NULL;
  LT_OK(loom_autocast_enter(mode, NULL, &tok));
  LT_OK(loom_linear(x, m->p[0], m->p[1], &h));
  LT_OK(loom_relu(h, &a));
  LT_OK(loom_linear(a, m->p[2], m->p[3], &lg));
  LT_OK(loom_cross_entropy(lg, y, LOOM_REDUCTION_MEAN, -100, &loss));
  LT_OK(loom_autocast_exit(&tok));
  loom_tensor_free(h);
  loom_tensor_free(a);
  loom_tensor_free(lg);
  return loss;
}

static void zero_grads(mlp *m) {
  for (int i = 0; i < NPARAM; i++) LT_OK(loom_tensor_zero_grad(m->p[i]));
}

static bool same_params(mlp *m, float *const *copy) {
  for (int i = 0; i < NPARAM; i++)
    if (memcmp(loom_tensor_data(m->p[i]), copy[i], loom_tensor_nbytes(m->p[i]))) return false;
  return true;
}

LT_TEST(amp_train_f16_dynamic_scaling_skips_exactly_the_overflowing_steps) {
  enum { STEPS = 30, INJECT_GRAD = 10, INJECT_INPUT = 20 };
  mlp m = {0};
  mlp_init(&m, 7);
  loom_dynamic_scaler_cfg cfg = loom_dynamic_scaler_cfg_default();
  cfg.growth_interval = 1000; /* no growth in this run: every change of scale is a backoff */
  loom_scaler *s = NULL;
  LT_OK(loom_scaler_create_dynamic(&cfg, &s));
  float *before[NPARAM];
  for (int i = 0; i < NPARAM; i++) before[i] = malloc(loom_tensor_nbytes(m.p[i]));
  double first = 0, last = 0;
  int skipped = 0;
  for (int k = 0; k < STEPS; k++) {
    loom_tensor *x = NULL, *y = NULL;
    batch(k % 8, &x, &y);
    if (k == INJECT_INPUT) LT_OK(loom_tensor_set(x, (int64_t[]){3, 5}, 1e5)); /* > f16 max */
    for (int i = 0; i < NPARAM; i++)
      memcpy(before[i], loom_tensor_data(m.p[i]), loom_tensor_nbytes(m.p[i]));
    float scale_before = loom_scaler_get_scale(s);
    zero_grads(&m);
    loom_tensor *loss = forward(&m, x, y, LOOM_AUTOCAST_F16);
    double lv = 0;
    LT_OK(loom_tensor_item(loss, &lv));
    LT_OK(loom_backward_amp(loss, s, false));
    if (k == INJECT_GRAD) { /* one gradient element multiplied by inf */
      float *g = loom_tensor_data(m.g[2]);
      g[17] *= INFINITY;
    }
    loom_named_tensor grads[NPARAM] = {
        {"w1", m.g[0]}, {"b1", m.g[1]}, {"w2", m.g[2]}, {"b2", m.g[3]}};
    bool ok = false;
    LT_OK(loom_amp_prepare_gradients(s, grads, NPARAM, true, NULL, &ok));
    bool injected = k == INJECT_GRAD || k == INJECT_INPUT;
    LT_EQ(ok, !injected); /* exactly the injected steps overflow */
    if (ok) LT_OK(loom_optim_step(m.opt));
    else skipped++;
    LT_OK(loom_scaler_update(s, !ok));
    LT_EQ(same_params(&m, before), !ok); /* skipped: bit-identical; stepped: changed */
    LT_NEAR(loom_scaler_get_scale(s), ok ? scale_before : scale_before / 2, 0);
    if (k == 0) first = lv;
    if (!injected) last = lv;
    loom_tensor_free(loss);
    loom_tensor_free(x);
    loom_tensor_free(y);
  }
  loom_scaler_stats st;
  LT_OK(loom_scaler_stats(s, &st));
  LT_EQ(skipped, 2);
  LT_EQ(st.total_overflows, 2);
  LT_EQ(st.total_successful_iterations, STEPS - 2);
  LT_EQ(st.scale_decrease_count, 2);
  LT_NEAR(st.current_scale, 65536 / 4, 0);
  LT_TRUE(last < 0.9 * first); /* it trained (about 1.39 -> 1.1 in 30 steps) */
  for (int i = 0; i < NPARAM; i++) free(before[i]);
  loom_scaler_free(s);
  mlp_free(&m);
}

/* The loss curve of STEPS steps under `mode` (no scaler: bf16 has f32's range). */
static void curve(loom_autocast_mode mode, int steps, double *out) {
  mlp m = {0};
  mlp_init(&m, 11);
  for (int k = 0; k < steps; k++) {
    loom_tensor *x = NULL, *y = NULL;
    batch(k % 8, &x, &y);
    zero_grads(&m);
    loom_tensor *loss = forward(&m, x, y, mode);
    LT_OK(loom_tensor_item(loss, &out[k]));
    LT_OK(loom_backward_amp(loss, NULL, false));
    LT_OK(loom_optim_step(m.opt));
    loom_tensor_free(loss);
    loom_tensor_free(x);
    loom_tensor_free(y);
  }
  mlp_free(&m);
}

LT_TEST(amp_train_bf16_loss_curve_tracks_f32) {
  /* Tolerance: bf16 keeps 8 significant bits, so each rounding of an input, weight or
   * activation errs by at most 2^-9 = 0.2% relative. The logits pass through about three such
   * roundings (input, weight, hidden activation), 0.6% at worst; with logits of size about 1 a
   * 0.6% change moves the cross entropy by at most about 0.006 on a step. Rounding errors of
   * the 64 rows and 4096 products mostly cancel, and the weights' drift over 60 small SGD
   * steps stays of the same order. Bound: |bf16 - f32| <= 0.01 at every step, mean gap
   * <= 0.005. Measured on this machine: worst gap 0.0003, mean 0.0001 (LOOM_TEST_VERBOSE=1
   * prints them). A broken autocast (no casts: gap 0; NaN, a wrong cast or gradient: far
   * beyond) is caught by the dtype checks of test_amp_autograd.c and by this bound. */
  enum { STEPS = 60 };
  double f32[STEPS], bf16[STEPS];
  curve(LOOM_AUTOCAST_OFF, STEPS, f32);
  curve(LOOM_AUTOCAST_BF16, STEPS, bf16);
  double mean = 0, worst = 0;
  for (int k = 0; k < STEPS; k++) {
    double d = fabs(bf16[k] - f32[k]);
    LT_TRUE(d <= 0.01);
    mean += d / STEPS;
    worst = fmax(worst, d);
  }
  LT_TRUE(mean <= 0.005);
  LT_TRUE(worst > 0); /* bf16 really ran: the curves are not identical */
  LT_TRUE(f32[STEPS - 1] < 0.7 * f32[0]);  /* both learned */
  LT_TRUE(bf16[STEPS - 1] < 0.7 * bf16[0]);
  if (getenv("LOOM_TEST_VERBOSE"))
    printf("bf16 vs f32 over %d steps: worst gap %.4f, mean %.4f (loss %.3f -> %.3f)\n", STEPS,
           worst, mean, f32[0], f32[STEPS - 1]);
}


static void segs_of(mlp *m, loom_param_seg seg[NPARAM]) {
  for (int i = 0; i < NPARAM; i++)
    seg[i] = (loom_param_seg){NULL, loom_tensor_data(m->p[i]), loom_tensor_data(m->g[i]),
                              loom_tensor_numel(m->p[i]), 0};
}

typedef enum { CHECK, CHECK_HOOKS, UNSCALE_HOOKS } way;

/* Hooks and the deferred unscale train bit-identically to the separate pass: model a unscales
 * in place (clips after unscaling when `clip`) and steps; model b unscales from the gradient
 * hooks (same gradients), or checks from the hooks (loom_amp_check_hooks_create) or with
 * loom_scaler_check and folds 1/scale (and the clip coefficient) into loom_optim_step_scaled.
 * Four f16 steps, one of them overflowing; the hooks also hold a leaf backward never reaches
 * (finish does it). Returns the hooks of b (for error checks) and frees the rest. */
static loom_amp_unscale_hooks *deferred_matches_separate(way w, bool clip, loom_scaler **sbp) {
  bool hooks = w != CHECK;
  mlp a = {0}, b = {0};
  mlp_init(&a, 5);
  mlp_init(&b, 5);
  loom_scaler *sa = NULL, *sb = NULL;
  LT_OK(loom_scaler_create_dynamic(NULL, &sa));
  LT_OK(loom_scaler_create_dynamic(NULL, &sb));
  loom_amp_unscale_hooks *h = NULL;
  loom_tensor *unused = NULL;
  LT_OK(loom_tensor_zeros(LOOM_F32, 1, (int64_t[]){3}, &unused));
  LT_OK(loom_tensor_set_requires_grad(unused, true));
  loom_tensor *ps[NPARAM + 1] = {b.p[0], b.p[1], b.p[2], b.p[3], unused};
  if (hooks)
    LT_OK((w == CHECK_HOOKS ? loom_amp_check_hooks_create
                            : loom__amp_unscale_hooks_create)(sb, ps, NPARAM + 1, &h));
  loom_param_seg sega[NPARAM], segb[NPARAM];
  segs_of(&a, sega);
  segs_of(&b, segb);
  for (int k = 0; k < 4; k++) {
    loom_tensor *x = NULL, *y = NULL;
    batch(k, &x, &y);
    if (k == 2) LT_OK(loom_tensor_set(x, (int64_t[]){0, 0}, 1e6)); /* overflows f16 */
    zero_grads(&a);
    zero_grads(&b);
    loom_tensor *la = forward(&a, x, y, LOOM_AUTOCAST_F16);
    LT_OK(loom_backward_amp(la, sa, false));
    bool fa = false, fb = false;
    LT_OK(loom_scaler_unscale(sa, a.g, NPARAM, &fa));
    if (hooks) LT_OK(loom_amp_unscale_hooks_arm(h));
    loom_tensor *lb = forward(&b, x, y, LOOM_AUTOCAST_F16);
    LT_OK(loom_backward_amp(lb, sb, false));
    if (hooks) LT_OK(loom_amp_unscale_hooks_finish(h, &fb));
    else LT_OK(loom_scaler_check(sb, b.g, NPARAM, &fb));
    LT_EQ(fa, fb);
    LT_EQ(fb, k == 2);
    for (int i = 0; i < NPARAM && w == UNSCALE_HOOKS; i++) /* unscaled in place alike */
      LT_TRUE(memcmp(loom_tensor_data(a.g[i]), loom_tensor_data(b.g[i]),
                     loom_tensor_nbytes(a.g[i])) == 0);
    float gs = 0;
    double na = 0, nb = 0;
    LT_OK(loom_scaler_grad_scale(sb, &gs));
    LT_TRUE(gs == (w == UNSCALE_HOOKS ? 1.0f : (float)(1.0 / (double)loom_scaler_get_scale(sb))));
    if (clip && !fa) {
      LT_OK(loom_clip_grad_norm(sega, NPARAM, 0.05, true, &na));
      LT_OK(loom_clip_grad_norm_scaled(segb, NPARAM, 0.05, gs, true, &nb, &gs));
      LT_TRUE(na == nb && na > 0.05); /* it clips */
    }
    if (!fa) LT_OK(loom_optim_step(a.opt));
    if (!fb) LT_OK(loom_optim_step_scaled(b.opt, gs));
    LT_OK(loom_scaler_update(sa, fa));
    LT_OK(loom_scaler_update(sb, fb));
    for (int i = 0; i < NPARAM; i++)
      LT_TRUE(memcmp(loom_tensor_data(a.p[i]), loom_tensor_data(b.p[i]),
                     loom_tensor_nbytes(a.p[i])) == 0);
    loom_tensor_free(la);
    loom_tensor_free(lb);
    loom_tensor_free(x);
    loom_tensor_free(y);
  }
  LT_NEAR(loom_scaler_get_scale(sb), 32768, 0);
  loom_tensor_free(unused);
  loom_scaler_free(sa);
  mlp_free(&a);
  mlp_free(&b);
  *sbp = sb;
  return h;
}

static void deferred_case(way w, bool clip) {
  loom_scaler *sb = NULL;
  loom_amp_unscale_hooks_free(deferred_matches_separate(w, clip, &sb));
  loom_scaler_free(sb);
}

LT_TEST(amp_deferred_check_matches_the_separate_pass) { deferred_case(CHECK, false); }
LT_TEST(amp_check_hooks_match_the_separate_pass) { deferred_case(CHECK_HOOKS, false); }
LT_TEST(amp_deferred_clip_matches_clip_after_unscale) { deferred_case(CHECK, true); }
LT_TEST(amp_check_hooks_with_clip_match) { deferred_case(CHECK_HOOKS, true); }

LT_TEST(amp_unscale_hooks_match_the_separate_pass) {
  loom_scaler *sb = NULL;
  loom_amp_unscale_hooks *h = deferred_matches_separate(UNSCALE_HOOKS, false, &sb);
  LT_ERR(loom_amp_unscale_hooks_finish(h, NULL), LOOM_EMISUSE, "not armed");
  LT_OK(loom_amp_unscale_hooks_arm(h));
  LT_ERR(loom_amp_unscale_hooks_finish(h, NULL), LOOM_EMISUSE, "no loss was scaled");
  loom_amp_unscale_hooks *bad = NULL;
  loom_tensor *nog = NULL;
  LT_OK(loom_tensor_zeros(LOOM_F32, 1, (int64_t[]){3}, &nog));
  LT_ERR(loom__amp_unscale_hooks_create(sb, &nog, 1, &bad), LOOM_EINVAL, "not a leaf that requires");
  LT_ERR(loom_amp_check_hooks_create(sb, &nog, 1, &bad), LOOM_EINVAL,
         "loom_amp_check_hooks_create: parameter 0 is not a leaf");
  LT_TRUE(bad == NULL);
  loom_amp_unscale_hooks_free(h);
  loom_amp_unscale_hooks_free(NULL);
  loom_tensor_free(nog);
  loom_scaler_free(sb);
}
