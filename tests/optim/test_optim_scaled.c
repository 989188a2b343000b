/* test_optim_scaled.c: the deferred unscale of the optimizers: loom_optim_step_scaled(s) equals
 * multiplying every gradient by s then loom_optim_step, bit for bit, on every CPU level, for
 * SGD (momentum, dampening, nesterov, weight decay, maximize), Adam and AdamW over several
 * steps; loom_clip_grad_norm_scaled folded into grad_scale equals unscale, clip, step (power-of-
 * two scales); the gradients are only read; bad arguments are refused with a message. */
#include "lt.h"
#include "optim/optim_int.h"

#include <math.h>

enum { N = 1037, CUT = 300 }; /* two segments, ragged lengths */

static uint64_t rng = 99;
static float frand(void) { /* xorshift64*, uniform in [-1, 1) */
  rng ^= rng >> 12, rng ^= rng << 25, rng ^= rng >> 27;
  return (float)((rng * 2685821657736338717ull) >> 40) / (float)(1 << 23) - 1.0f;
}

typedef enum { SGD_PLAIN, SGD_MOM, SGD_NESTEROV, SGD_MAX_DAMP, ADAM, ADAMW, KINDS } kind;

static int make(kind k, float *p, float *g, loom_optim **o) {
  loom_param_seg s[2] = {{.name = "w", .param = p, .grad = g, .n = CUT},
                         {.name = "b", .param = p + CUT, .grad = g + CUT, .n = N - CUT,
                          .flags = LOOM_SEG_NO_DECAY}};
  if (k >= ADAM) {
    loom_adam_cfg c = k == ADAM ? loom_adam_cfg_default() : loom_adamw_cfg_default();
    c.lr = 0.01, c.weight_decay = 0.05;
    return (k == ADAM ? loom_optim_create_adam : loom_optim_create_adamw)(s, 2, &c, o);
  }
  loom_sgd_cfg c = loom_sgd_cfg_default();
  c.lr = 0.1, c.weight_decay = 0.01;
  if (k != SGD_PLAIN) c.momentum = 0.9;
  if (k == SGD_NESTEROV) c.nesterov = true;
  if (k == SGD_MAX_DAMP) c.dampening = 0.3, c.maximize = true;
  return loom_optim_create_sgd(s, 2, &c, o);
}

static const char *kind_name(kind k) {
  static const char *names[] = {"sgd", "sgd momentum", "sgd nesterov", "sgd maximize+dampening",
                                "adam", "adamw"};
  return names[k];
}

/* 3 steps of kind k at the active level on gradients that are scaled by `scale` (the same
 * ones for every call with the same k): path 0 multiplies a copy by inv = 1/scale in f32 (as
 * unscale does) then steps; path 1 steps_scaled(inv). The parameters land in p. */
static void run(kind k, float scale, int path, float *p) {
  static float graw[N], gcopy[N];
  float inv = (float)(1.0 / (double)scale);
  rng = 1234 + (uint64_t)k;
  for (int i = 0; i < N; i++) p[i] = frand();
  loom_optim *o = NULL;
  LT_OK(make(k, p, path ? graw : gcopy, &o));
  for (int t = 0; t < 3; t++) {
    for (int i = 0; i < N; i++) graw[i] = frand() * 1e-3f * scale;
    if (path == 0) {
      for (int i = 0; i < N; i++) gcopy[i] = graw[i] * inv;
      LT_OK(loom_optim_step(o));
    } else {
      LT_OK(loom_optim_step_scaled(o, inv));
    }
  }
  loom_optim_free(o);
}

static const float scales[] = {65536.0f, 1024.0f, 0.5f, 3.0f, 1.0f};
#define NSCALES (sizeof scales / sizeof *scales)

/* Bit for bit for every scale (not only powers of two): both round g * inv once in f32. */
LT_TEST(step_scaled_equals_unscale_then_step_every_level) {
  static float pa[N], pb[N];
  loom_cpu_level saved = loom_cpu_level_active();
  for (int level = 0; level < LOOM_CPU_LEVEL_COUNT; level++) {
    if (!loom_cpu_supports((loom_cpu_level)level)) continue;
    LT_OK(loom_set_cpu_level((loom_cpu_level)level));
    for (kind k = 0; k < KINDS; k++)
      for (size_t si = 0; si < NSCALES; si++) {
        run(k, scales[si], 0, pa);
        run(k, scales[si], 1, pb);
        if (memcmp(pa, pb, sizeof pa) != 0)
          lt_fail_at(__FILE__, __LINE__, "%s, level %s, scale %g: step_scaled differs from "
                     "unscale + step", kind_name(k),
                     loom_cpu_level_name((loom_cpu_level)level), (double)scales[si]);
      }
  }
  LT_OK(loom_set_cpu_level(saved));
}

/* Every SIMD level's step_scaled gives the scalar level's bits. */
LT_TEST(step_scaled_levels_bitwise_equal_to_scalar) {
  static float ref[N], got[N];
  loom_cpu_level saved = loom_cpu_level_active();
  int tested = 0;
  for (kind k = 0; k < KINDS; k++)
    for (size_t si = 0; si < NSCALES; si++) {
      LT_OK(loom_set_cpu_level(LOOM_CPU_SCALAR));
      run(k, scales[si], 1, ref);
      for (int level = 1; level < LOOM_CPU_LEVEL_COUNT; level++) {
        if (!loom_cpu_supports((loom_cpu_level)level)) continue;
        LT_OK(loom_set_cpu_level((loom_cpu_level)level));
        run(k, scales[si], 1, got);
        tested++;
        if (memcmp(ref, got, sizeof ref) != 0)
          lt_fail_at(__FILE__, __LINE__, "%s, scale %g: level %s differs from scalar",
                     kind_name(k), (double)scales[si],
                     loom_cpu_level_name((loom_cpu_level)level));
      }
    }
  LT_OK(loom_set_cpu_level(saved));
  if (!tested) lt_skip("no SIMD level on this CPU");
}

LT_TEST(step_scaled_reads_gradients_only) {
  static float p[N], g[N], keep[N];
  for (int i = 0; i < N; i++) p[i] = frand(), g[i] = frand() * 4096.0f;
  memcpy(keep, g, sizeof g);
  for (kind k = 0; k < KINDS; k++) {
    loom_optim *o = NULL;
    LT_OK(make(k, p, g, &o));
    LT_OK(loom_optim_step_scaled(o, 1.0f / 4096));
    LT_TRUE(memcmp(g, keep, sizeof g) == 0);
    LT_EQ(loom_optim_step_count(o), 1);
    loom_optim_free(o);
  }
}

LT_TEST(step_scaled_errors) {
  float p[4] = {0}, g[4] = {0};
  loom_optim *o = NULL;
  loom_param_seg s = {.param = p, .grad = g, .n = 4};
  loom_sgd_cfg c = loom_sgd_cfg_default();
  LT_OK(loom_optim_create_sgd(&s, 1, &c, &o));
  LT_ERR(loom_optim_step_scaled(o, NAN), LOOM_EINVAL, "grad_scale = nan must be finite");
  LT_ERR(loom_optim_step_scaled(o, INFINITY), LOOM_EINVAL, "grad_scale = inf");
  LT_ERR(loom_optim_step_scaled(o, -1.0f), LOOM_EINVAL, "grad_scale = -1");
  LT_EQ(loom_optim_step_count(o), 0); /* refused steps do not count */
  LT_OK(loom_optim_step_scaled(o, 0.0f)); /* clipping an infinite norm scales by 0 */
  LT_EQ(loom_optim_step_count(o), 1);
  LT_ERR(loom_optim_step_scaled(NULL, 1.0f), LOOM_EINVAL, "loom_optim_step_scaled: optimizer "
         "is NULL");
  loom_optim_free(o);
}

/* Clip after unscale (unscale by inv, loom_clip_grad_norm, step) against the folded form
 * (loom_clip_grad_norm_scaled, step_scaled), power-of-two scales, clipping active and not. */
LT_TEST(clip_scaled_equals_clip_after_unscale) {
  static float pa[N], pb[N], graw[N], gun[N];
  const float pow2[] = {65536.0f, 32.0f, 1.0f, 0.25f};
  const double max_norms[] = {1e-3, 1e9}; /* clips / does not clip */
  for (kind k = 0; k < KINDS; k++)
    for (size_t si = 0; si < 4; si++)
      for (int mi = 0; mi < 2; mi++) {
        float inv = (float)(1.0 / (double)pow2[si]);
        for (int i = 0; i < N; i++) pa[i] = pb[i] = frand();
        loom_optim *oa = NULL, *ob = NULL;
        LT_OK(make(k, pa, gun, &oa));
        LT_OK(make(k, pb, graw, &ob));
        for (int t = 0; t < 3; t++) {
          for (int i = 0; i < N; i++) graw[i] = frand() * 1e-2f * pow2[si];
          for (int i = 0; i < N; i++) gun[i] = graw[i] * inv;
          loom_param_seg sa = {.param = pa, .grad = gun, .n = N};
          loom_param_seg sb = {.param = pb, .grad = graw, .n = N};
          double na = 0, nb = 0;
          float gs = 0;
          LT_OK(loom_clip_grad_norm(&sa, 1, max_norms[mi], true, &na));
          LT_OK(loom_clip_grad_norm_scaled(&sb, 1, max_norms[mi], inv, true, &nb, &gs));
          LT_TRUE(memcmp(&na, &nb, sizeof na) == 0);
          if (mi == 1) LT_TRUE(gs == inv); /* no clipping: the plain unscale */
          LT_OK(loom_optim_step(oa));
          LT_OK(loom_optim_step_scaled(ob, gs));
        }
        if (memcmp(pa, pb, sizeof pa) != 0)
          lt_fail_at(__FILE__, __LINE__, "%s, scale %g, max_norm %g: folded clip differs",
                  kind_name(k), (double)pow2[si], max_norms[mi]);
        loom_optim_free(oa);
        loom_optim_free(ob);
      }
}

LT_TEST(clip_scaled_errors_and_nonfinite) {
  float g[3] = {3.0f * 1024, 4.0f * 1024, 0.0f}, gs = 0;
  double norm = 0;
  loom_param_seg s = {.grad = g, .n = 3};
  LT_OK(loom_clip_grad_norm_scaled(&s, 1, 1.0, 1.0f / 1024, true, &norm, &gs));
  LT_NEAR(norm, 5.0, 0);
  LT_NEAR(gs, (1.0 / 1024) * (1.0 / (5.0 + 1e-6)), 1e-10);
  LT_TRUE(g[0] == 3072.0f && g[1] == 4096.0f); /* not written */
  LT_ERR(loom_clip_grad_norm_scaled(&s, 1, 1.0, 0.0f, true, &norm, &gs), LOOM_EINVAL,
         "inv_scale = 0 must be finite and > 0");
  LT_ERR(loom_clip_grad_norm_scaled(&s, 1, 1.0, NAN, true, &norm, &gs), LOOM_EINVAL,
         "inv_scale = nan");
  LT_ERR(loom_clip_grad_norm_scaled(&s, 1, 1.0, 1.0f, true, &norm, NULL), LOOM_EINVAL,
         "grad_scale is NULL");
  LT_ERR(loom_clip_grad_norm_scaled(&s, 1, -2.0, 1.0f, true, &norm, &gs), LOOM_EINVAL,
         "loom_clip_grad_norm_scaled: max_norm = -2");
  LT_ERR(loom_clip_grad_norm_scaled(NULL, 1, 1.0, 1.0f, true, &norm, &gs), LOOM_EINVAL,
         "segs is NULL");
  g[2] = INFINITY;
  LT_ERR(loom_clip_grad_norm_scaled(&s, 1, 1.0, 0.5f, true, &norm, &gs), LOOM_EINVAL,
         "total norm is inf");
  LT_OK(loom_clip_grad_norm_scaled(&s, 1, 1.0, 0.5f, false, &norm, &gs));
  LT_TRUE(isinf(norm) && gs == 0.0f); /* PyTorch's coefficient for an infinite norm */
}
