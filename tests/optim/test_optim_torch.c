/* test_optim_torch.c: SGD, Adam and AdamW against PyTorch 1.13, three steps on a 5-vector,
 * at every CPU level. The expected literals below were produced by tests/optim/torch_ref.py
 * (/usr/bin/python3 with torch 1.13, torch.optim.<cls>(**kw)), the
 * gradients G below set as p.grad before each opt.step(), values printed with %.9g.
 * PyTorch's vectorised add uses fused multiply-add, loom never does, so the match is to a few
 * ulp, not bitwise. */
#include "lt.h"

static const float P0[5] = {0.5f, -1.25f, 2.0f, -0.75f, 0.125f};
static const float G[3][5] = {{0.1f, -0.2f, 0.3f, 0.4f, -0.5f},
                              {-0.25f, 0.5f, 0.125f, -1.0f, 2.0f},
                              {1.5f, 0.0f, -0.3f, 0.7f, 0.05f}};

/* sgd_momentum_wd: SGD({'lr': 0.1, 'momentum': 0.9, 'weight_decay': 0.01}) */
static const float sgd_momentum_wd_p[3][5] = {{0.489499986f, -1.22874999f, 1.96800005f, -0.789250016f, 0.174875006f}, {0.504560471f, -1.25839627f, 1.92473209f, -0.723785758f, 0.0195876192f}, {0.367610365f, -1.28381956f, 1.91386616f, -0.734144151f, -0.125190616f}};
static const float sgd_momentum_wd_momentum_buffer[5] = {1.36950111f, 0.254232287f, 0.108659297f, 0.103583932f, 1.4477824f};
/* sgd_nesterov: SGD({'lr': 0.05, 'momentum': 0.8, 'nesterov': True}) */
static const float sgd_nesterov_p[3][5] = {{0.490999997f, -1.23199999f, 1.97300005f, -0.786000013f, 0.170000002f}, {0.510299981f, -1.27059996f, 1.95215011f, -0.708800018f, 0.00600000098f}, {0.380739987f, -1.28147995f, 1.96747005f, -0.750039995f, -0.0497000031f}};
static const float sgd_nesterov_momentum_buffer[5] = {1.36399996f, 0.271999985f, -0.00799998641f, 0.156000018f, 1.33000004f};
/* sgd_dampening_maximize: SGD({'lr': 0.1, 'momentum': 0.5, 'dampening': 0.25, 'maximize': True}) */
static const float sgd_dampening_maximize_p[3][5] = {{0.50999999f, -1.26999998f, 2.02999997f, -0.709999979f, 0.075000003f}, {0.496250004f, -1.24249995f, 2.05437493f, -0.764999986f, 0.200000003f}, {0.601875007f, -1.22874999f, 2.04406238f, -0.74000001f, 0.266250014f}};
static const float sgd_dampening_maximize_momentum_buffer[5] = {-1.05624998f, -0.137500003f, 0.103125006f, -0.249999985f, -0.662500024f};
/* sgd_plain: SGD({'lr': 0.2}) */
static const float sgd_plain_p[3][5] = {{0.479999989f, -1.21000004f, 1.93999994f, -0.829999983f, 0.224999994f}, {0.529999971f, -1.31000006f, 1.91499996f, -0.629999995f, -0.175000012f}, {0.229999959f, -1.31000006f, 1.97500002f, -0.769999981f, -0.185000017f}};
/* adam_l2: Adam({'lr': 0.01, 'weight_decay': 0.1}) */
static const float adam_l2_p[3][5] = {{0.49000001f, -1.24000001f, 1.99000001f, -0.75999999f, 0.135000005f}, {0.491958618f, -1.24125051f, 1.98032951f, -0.754812717f, 0.12934342f}, {0.485894263f, -1.24063933f, 1.97404003f, -0.754411995f, 0.124778807f}};
static const float adam_l2_exp_avg[5] = {0.148979589f, -0.00489750784f, 0.0594632961f, -0.00806312915f, 0.148020923f};
static const float adam_l2_exp_avg_sq[5] = {0.00246282364f, 0.000262055546f, 0.000364768581f, 0.00165205577f, 0.00429127039f};
/* adam_default: Adam({}) */
static const float adam_default_p[3][5] = {{0.499000013f, -1.24899995f, 1.99899995f, -0.750999987f, 0.126000002f}, {0.49944222f, -1.24944222f, 1.99809515f, -0.75055778f, 0.125440493f}, {0.4988738f, -1.24978411f, 1.99801493f, -0.750619471f, 0.124992624f}};
static const float adam_default_exp_avg[5] = {0.135600001f, 0.0287999976f, 0.00555000035f, 0.012400005f, 0.144499987f};
static const float adam_default_exp_avg_sq[5] = {0.00232241745f, 0.000289670046f, 0.000195429486f, 0.00164868019f, 0.00424800068f};
/* adamw: AdamW({'lr': 0.01, 'weight_decay': 0.1}) */
static const float adamw_p[3][5] = {{0.489500016f, -1.23874998f, 1.98800004f, -0.759249985f, 0.134875f}, {0.493432671f, -1.24193347f, 1.97696412f, -0.754068613f, 0.129145101f}, {0.487255096f, -1.24410987f, 1.97418511f, -0.753931463f, 0.124537274f}};
static const float adamw_exp_avg[5] = {0.135600001f, 0.0287999976f, 0.00555000035f, 0.012400005f, 0.144499987f};
static const float adamw_exp_avg_sq[5] = {0.00232241745f, 0.000289670046f, 0.000195429486f, 0.00164868019f, 0.00424800068f};
/* adamw_betas: AdamW({'lr': 0.05, 'betas': (0.5, 0.75), 'eps': 0.001}) */
static const float adamw_betas_p[3][5] = {{0.450245023f, -1.1996237f, 1.94916606f, -0.799500287f, 0.174837694f}, {0.483187377f, -1.23227406f, 1.90632391f, -0.765808821f, 0.137064457f}, {0.442899138f, -1.25055754f, 1.92338943f, -0.776713371f, 0.114346281f}};
static const float adamw_betas_exp_avg[5] = {0.699999988f, 0.100000001f, -0.0812500045f, 0.149999991f, 0.462500006f};
static const float adamw_betas_exp_avg_sq[5] = {0.575625002f, 0.0525000021f, 0.0380859412f, 0.332500011f, 0.785781264f};
/* clip_grad_norm_([a,b], 2.0): norm 5.5 */
static const float clip_norm = 5.5f;
static const float clip_a[3] = {1.090909f, -1.45454526f, 0.363636315f};
static const float clip_b[2] = {0.181818157f, 0.72727263f};

/* Runs 3 steps of `kind` ("sgd", "adam", "adamw") and compares params after every step and the
 * final state buffer(s) with PyTorch's, to a few ulp of the operands (relative 5e-7 plus
 * 6e-8 absolute, for results that cancel). */
static void check(const char *kind, const void *cfg, const float (*want)[5], const char *st0,
                  const float *want0, const char *st1, const float *want1) {
  for (int level = 0; level < LOOM_CPU_LEVEL_COUNT; level++) {
    if (!loom_cpu_supports((loom_cpu_level)level)) continue;
    LT_OK(loom_set_cpu_level((loom_cpu_level)level));
    float p[5], g[5];
    memcpy(p, P0, sizeof p);
    loom_param_seg seg = {.name = "w", .param = p, .grad = g, .n = 5};
    loom_optim *o = NULL;
    if (kind[0] == 's') LT_OK(loom_optim_create_sgd(&seg, 1, cfg, &o));
    else if (strcmp(kind, "adam") == 0) LT_OK(loom_optim_create_adam(&seg, 1, cfg, &o));
    else LT_OK(loom_optim_create_adamw(&seg, 1, cfg, &o));
    if (!o) return;
    for (int t = 0; t < 3; t++) {
      memcpy(g, G[t], sizeof g);
      LT_OK(loom_optim_step(o));
      for (int i = 0; i < 5; i++) LT_NEAR(p[i], want[t][i], 5e-7 * fabs(want[t][i]) + 6e-8);
    }
    LT_EQ(loom_optim_step_count(o), 3);
    const char *names[2] = {st0, st1};
    const float *wants[2] = {want0, want1};
    for (int k = 0; k < 2; k++) {
      if (!names[k]) continue;
      loom_optim_state s;
      LT_OK(loom_optim_state_find(o, names[k], &s));
      LT_EQ(s.n, 5);
      for (int i = 0; i < 5; i++)
        LT_NEAR(s.data[i], wants[k][i], 5e-7 * fabs(wants[k][i]) + 6e-8);
    }
    loom_optim_free(o);
  }
  LT_OK(loom_set_cpu_level(loom_cpu_level_best()));
}

LT_TEST(sgd_matches_torch) {
  loom_sgd_cfg c = loom_sgd_cfg_default();
  c.lr = 0.1, c.momentum = 0.9, c.weight_decay = 0.01;
  check("sgd", &c, sgd_momentum_wd_p, "w.momentum_buffer", sgd_momentum_wd_momentum_buffer, NULL,
        NULL);
  c = loom_sgd_cfg_default();
  c.lr = 0.05, c.momentum = 0.8, c.nesterov = true;
  check("sgd", &c, sgd_nesterov_p, "w.momentum_buffer", sgd_nesterov_momentum_buffer, NULL, NULL);
  c = loom_sgd_cfg_default();
  c.lr = 0.1, c.momentum = 0.5, c.dampening = 0.25, c.maximize = true;
  check("sgd", &c, sgd_dampening_maximize_p, "w.momentum_buffer",
        sgd_dampening_maximize_momentum_buffer, NULL, NULL);
  c = loom_sgd_cfg_default();
  c.lr = 0.2;
  check("sgd", &c, sgd_plain_p, NULL, NULL, NULL, NULL);
}

LT_TEST(adam_matches_torch) {
  loom_adam_cfg c = loom_adam_cfg_default();
  check("adam", &c, adam_default_p, "w.exp_avg", adam_default_exp_avg, "w.exp_avg_sq",
        adam_default_exp_avg_sq);
  c.lr = 0.01, c.weight_decay = 0.1;
  check("adam", &c, adam_l2_p, "w.exp_avg", adam_l2_exp_avg, "w.exp_avg_sq", adam_l2_exp_avg_sq);
}

LT_TEST(adamw_matches_torch) {
  loom_adam_cfg c = loom_adamw_cfg_default();
  c.lr = 0.01, c.weight_decay = 0.1;
  check("adamw", &c, adamw_p, "w.exp_avg", adamw_exp_avg, "w.exp_avg_sq", adamw_exp_avg_sq);
  c = loom_adamw_cfg_default();
  c.lr = 0.05, c.beta1 = 0.5, c.beta2 = 0.75, c.eps = 1e-3;
  check("adamw", &c, adamw_betas_p, "w.exp_avg", adamw_betas_exp_avg, "w.exp_avg_sq",
        adamw_betas_exp_avg_sq);
}

LT_TEST(clip_grad_norm_matches_torch) {
  float pa[3] = {0}, pb[2] = {0};
  float a[3] = {3.0f, -4.0f, 1.0f}, b[2] = {0.5f, 2.0f};
  loom_param_seg segs[2] = {{.param = pa, .grad = a, .n = 3}, {.param = pb, .grad = b, .n = 2}};
  double norm = 0;
  LT_OK(loom_clip_grad_norm(segs, 2, 2.0, false, &norm));
  LT_NEAR(norm, clip_norm, 0);
  for (int i = 0; i < 3; i++) LT_NEAR(a[i], clip_a[i], 1e-7);
  for (int i = 0; i < 2; i++) LT_NEAR(b[i], clip_b[i], 1e-7);
}
