/* test_optim.c: the optimizers' own properties: hand-computed updates from the formulas, every
 * SIMD level bit-identical to the scalar reference (random data, ragged lengths, every flag),
 * segments (one arena = its pieces), state save/restore continuing bit-identically, config
 * validation messages, schedules, f32 master weights, and out-of-memory sweeps of the create
 * paths. Clipping is test_clip.c's. */
#include "lt.h"
#include "ops/gemm.h"
#include "optim/optim_int.h"
#include "loom/ops.h"
#include "ops/gemm.h"

#include <stdlib.h>

static uint64_t rng_state = 12345;
static float frand(void) { /* xorshift64*, uniform in [-1, 1) */
  rng_state ^= rng_state >> 12, rng_state ^= rng_state << 25, rng_state ^= rng_state >> 27;
  return (float)((rng_state * 2685821657736338717ull) >> 40) / (float)(1 << 23) - 1.0f;
}
static void fill(float *x, size_t n, float scale) {
  for (size_t i = 0; i < n; i++) x[i] = frand() * scale;
}

LT_TEST(adam_first_step_by_hand) {
  /* step 1 from zero moments: m = (1-b1)g, v = (1-b2)g^2, so
   * p1 = p0 - lr * (m/bc1) / (sqrt(v/bc2) + eps) = p0 - lr * g / (|g| + eps), in double. */
  float p[4] = {1.0f, -2.0f, 0.5f, 3.0f}, g[4] = {0.25f, -1e-3f, 4.0f, 0.0f};
  loom_param_seg s = {.param = p, .grad = g, .n = 4};
  loom_adam_cfg c = loom_adam_cfg_default();
  c.lr = 0.1;
  loom_optim *o = NULL;
  LT_OK(loom_optim_create_adam(&s, 1, &c, &o));
  double want[4];
  for (int i = 0; i < 4; i++) want[i] = p[i] - 0.1 * g[i] / (fabs(g[i]) + 1e-8);
  LT_OK(loom_optim_step(o));
  for (int i = 0; i < 4; i++) LT_NEAR(p[i], want[i], 2e-7 * fabs(want[i]));
  /* second step, AdamW-free Adam formula in double */
  double m[4], v[4];
  for (int i = 0; i < 4; i++) m[i] = 0.1 * g[i], v[i] = 0.001 * (double)g[i] * g[i];
  float g2[4] = {-0.5f, 2.0f, 1.0f, 0.125f};
  memcpy(g, g2, sizeof g);
  for (int i = 0; i < 4; i++) {
    m[i] = 0.9 * m[i] + 0.1 * g[i];
    v[i] = 0.999 * v[i] + 0.001 * (double)g[i] * g[i];
    double bc1 = 1 - 0.9 * 0.9, bc2 = 1 - 0.999 * 0.999;
    want[i] = p[i] - 0.1 / bc1 * m[i] / (sqrt(v[i]) / sqrt(bc2) + 1e-8);
  }
  LT_OK(loom_optim_step(o));
  for (int i = 0; i < 4; i++) LT_NEAR(p[i], want[i], 1e-6 * fabs(want[i]));
  loom_optim_free(o);
}

LT_TEST(sgd_momentum_by_hand) {
  /* lr 0.5, momentum 0.9, dampening 0.5, wd 0.25: d = g + 0.25p; buf = d (first step), then
   * buf = 0.9 buf + 0.5 d; p -= 0.5 buf. All values exact in binary. */
  float p[2] = {1.0f, -2.0f}, g[2] = {0.5f, 1.0f};
  loom_param_seg s = {.param = p, .grad = g, .n = 2};
  loom_sgd_cfg c = loom_sgd_cfg_default();
  c.lr = 0.5, c.momentum = 0.9, c.dampening = 0.5, c.weight_decay = 0.25;
  loom_optim *o = NULL;
  LT_OK(loom_optim_create_sgd(&s, 1, &c, &o));
  LT_OK(loom_optim_step(o)); /* d = {0.75, 0.5}; buf = d; p = {0.625, -2.25} */
  LT_NEAR(p[0], 0.625, 0);
  LT_NEAR(p[1], -2.25, 0);
  LT_OK(loom_optim_step(o)); /* d = {0.65625, 0.4375}; buf = 0.9*{0.75,0.5} + 0.5d */
  double b0 = 0.9 * 0.75 + 0.5 * 0.65625, b1 = 0.9 * 0.5 + 0.5 * 0.4375;
  LT_NEAR(p[0], 0.625 - 0.5 * b0, 1e-7);
  LT_NEAR(p[1], -2.25 - 0.5 * b1, 1e-7);
  loom_optim_free(o);
}

/* Every level's kernel gives the scalar kernel's bits, for every flag and ragged lengths. */
LT_TEST(kernels_every_level_bitwise_equal_to_scalar) {
  enum { N = 1000 };
  static float p0[N], g[N], m0[N], v0[N], p[2][N], m[2][N], v[2][N];
  fill(p0, N, 2), fill(g, N, 1), fill(m0, N, 0.1f);
  for (int i = 0; i < N; i++) v0[i] = fabsf(frand()) * 0.01f;
  const loom__optim_kernels *ref = loom__optim_k_level(LOOM_CPU_SCALAR);
  size_t lens[] = {0, 1, 7, 8, 15, 16, 17, 31, 33, 100, 999, N};
  int tested = 0;
  for (int level = 1; level < LOOM_CPU_LEVEL_COUNT; level++) {
    if (!loom_cpu_supports((loom_cpu_level)level)) continue;
    tested++;
    const loom__optim_kernels *k = loom__optim_k_level((loom_cpu_level)level);
    for (int flags = 0; flags < 32; flags++)
      for (size_t li = 0; li < sizeof lens / sizeof *lens; li++) {
        size_t n = lens[li], off = li % 3; /* misaligned starts too */
        if (n + off > N) n = N - off;
        /* flag 16: a grad_scale folded into the load (not a power of two: rounds) */
        float gs = (flags & 16) ? 1.0f / 3.0f : 1.0f;
        loom__adam_args a = {.beta1 = 0.9f, .omb1 = 0.1f, .beta2 = 0.999f, .omb2 = 0.001f,
                             .wd = 0.05f, .decay = 0.999f, .bc2_sqrt = 0.3f, .eps = 1e-8f,
                             .neg_step = -0.01f, .grad_scale = gs, .l2 = flags & 1,
                             .decoupled = (flags & 2) != 0, .maximize = (flags & 4) != 0,
                             .scaled = (flags & 16) != 0};
        for (int r = 0; r < 2; r++) {
          memcpy(p[r], p0, sizeof p0), memcpy(m[r], m0, sizeof m0), memcpy(v[r], v0, sizeof v0);
          (r ? k : ref)->adam(&a, p[r] + off, g + off, m[r] + off, v[r] + off, n);
        }
        LT_TRUE(memcmp(p[0], p[1], sizeof p0) == 0 && memcmp(m[0], m[1], sizeof m0) == 0 &&
                memcmp(v[0], v[1], sizeof v0) == 0);
        loom__sgd_args s = {.wd = 0.01f, .momentum = 0.9f, .omd = 0.75f, .neg_lr = -0.1f,
                            .grad_scale = gs, .has_wd = flags & 1,
                            .has_momentum = (flags & 2) != 0, .first = (flags & 4) != 0,
                            .nesterov = (flags & 8) != 0, .maximize = (flags & 3) == 3,
                            .scaled = (flags & 16) != 0};
        for (int r = 0; r < 2; r++) {
          memcpy(p[r], p0, sizeof p0), memcpy(m[r], m0, sizeof m0);
          (r ? k : ref)->sgd(&s, p[r] + off, g + off, m[r] + off, n);
        }
        LT_TRUE(memcmp(p[0], p[1], sizeof p0) == 0 && memcmp(m[0], m[1], sizeof m0) == 0);
        double l0[16], l1[16]; /* the lanes carry on from what they hold */
        for (int j = 0; j < 16; j++) l0[j] = l1[j] = 0.25 * j;
        ref->sumsq(l0, g + off, n), k->sumsq(l1, g + off, n);
        LT_TRUE(memcmp(l0, l1, sizeof l0) == 0);
        for (int r = 0; r < 2; r++) {
          memcpy(p[r], p0, sizeof p0);
          (r ? k : ref)->scale(p[r] + off, 0.37f, n);
        }
        LT_TRUE(memcmp(p[0], p[1], sizeof p0) == 0);
      }
  }
  if (!tested) lt_skip("no SIMD level on this CPU");
}

/* A long segment's whole step runs in chunks over the caller's OpenMP team (optim.c): SGD with
 * momentum, Adam and AdamW on 2 threads, past the threshold with a ragged last chunk, equal
 * the same steps on 1 thread bit for bit. */
LT_TEST(long_segment_on_two_threads_equals_one) {
  enum { N = (1 << 17) + (1 << 15) + 3 };
  float *p1 = malloc(N * sizeof *p1), *p2 = malloc(N * sizeof *p2), *g = malloc(N * sizeof *g);
  LT_TRUE(p1 && p2 && g);
  int before = loom__gemm_threads();
  for (int kind = 0; kind < 3 && p1 && p2 && g; kind++) {
    fill(p1, N, 1);
    memcpy(p2, p1, N * sizeof *p1);
    loom_param_seg s1 = {.param = p1, .grad = g, .n = N}, s2 = {.param = p2, .grad = g, .n = N};
    loom_sgd_cfg cs = loom_sgd_cfg_default();
    cs.momentum = 0.9, cs.weight_decay = 1e-3;
    loom_adam_cfg ca = kind == 2 ? loom_adamw_cfg_default() : loom_adam_cfg_default();
    ca.weight_decay = 1e-2;
    loom_optim *a = NULL, *b = NULL;
    for (int k = 0; k < 2; k++) {
      loom_param_seg *sk = k ? &s2 : &s1;
      loom_optim **ok = k ? &b : &a;
      if (kind == 0) LT_OK(loom_optim_create_sgd(sk, 1, &cs, ok));
      if (kind == 1) LT_OK(loom_optim_create_adam(sk, 1, &ca, ok));
      if (kind == 2) LT_OK(loom_optim_create_adamw(sk, 1, &ca, ok));
    }
    for (int t = 0; t < 3; t++) {
      fill(g, N, 1);
      loom_set_num_threads(1);
      LT_OK(loom_optim_step(a));
      loom_set_num_threads(2);
      LT_OK(loom_optim_step(b));
    }
    LT_TRUE(memcmp(p1, p2, N * sizeof *p1) == 0);
    loom_optim_free(a);
    loom_optim_free(b);
  }
  loom__gemm_set_threads(before);
  free(p1), free(p2), free(g);
}

/* Stepping two segments equals stepping their concatenation: a shard is a shorter buffer. */
LT_TEST(segments_equal_one_arena) {
  enum { N = 203, CUT = 77 };
  static float pa[N], pb[N], g[N];
  fill(pa, N, 1), fill(g, N, 1);
  memcpy(pb, pa, sizeof pa);
  loom_adam_cfg c = loom_adamw_cfg_default();
  loom_param_seg one = {.name = "all", .param = pa, .grad = g, .n = N};
  loom_param_seg two[2] = {{.name = "a", .param = pb, .grad = g, .n = CUT},
                           {.name = "b", .param = pb + CUT, .grad = g + CUT, .n = N - CUT}};
  loom_optim *o1 = NULL, *o2 = NULL;
  LT_OK(loom_optim_create_adamw(&one, 1, &c, &o1));
  LT_OK(loom_optim_create_adamw(two, 2, &c, &o2));
  for (int t = 0; t < 4; t++) {
    fill(g, N, 1);
    LT_OK(loom_optim_step(o1));
    LT_OK(loom_optim_step(o2));
  }
  LT_TRUE(memcmp(pa, pb, sizeof pa) == 0);
  LT_EQ(loom_optim_state_count(o2), 4);
  loom_optim_state s;
  LT_OK(loom_optim_state_at(o2, 3, &s));
  LT_STREQ(s.name, "b.exp_avg_sq");
  LT_EQ(s.n, N - CUT);
  LT_ERR(loom_optim_state_at(o2, 4, &s), LOOM_EINVAL, "out of range");
  LT_ERR(loom_optim_state_find(o2, "c.exp_avg", &s), LOOM_ENOTFOUND, "no state \"c.exp_avg\"");
  loom_optim_free(o1);
  loom_optim_free(o2);
}

LT_TEST(no_decay_segment_skips_weight_decay) {
  float p[2] = {1.0f, 1.0f}, g[2] = {0.0f, 0.0f};
  loom_param_seg s[2] = {{.param = p, .grad = g, .n = 1},
                         {.param = p + 1, .grad = g + 1, .n = 1, .flags = LOOM_SEG_NO_DECAY}};
  loom_sgd_cfg c = loom_sgd_cfg_default();
  c.lr = 0.5, c.weight_decay = 0.5;
  loom_optim *o = NULL;
  LT_OK(loom_optim_create_sgd(s, 2, &c, &o));
  LT_OK(loom_optim_step(o));
  LT_NEAR(p[0], 0.75, 0);
  LT_NEAR(p[1], 1.0, 0);
  LT_STREQ(loom_optim_name(o), "sgd");
  LT_EQ(loom_optim_state_count(o), 0);
  loom_optim_free(o);
}

/* Run A for 7 steps; run B for 3, save its params, state and step count; build C fresh from
 * the saved copy and run 4 more: C ends with A's bits. For each optimizer kind. */
LT_TEST(state_restore_continues_bit_identically) {
  enum { N = 301 };
  static float pa[N], pb[N], pc[N], g[7][N];
  for (int kind = 0; kind < 3; kind++) {
    rng_state = 99;
    fill(pa, N, 1);
    for (int t = 0; t < 7; t++) fill(g[t], N, 1);
    memcpy(pb, pa, sizeof pa);
    static float grad[N];
    loom_param_seg sa = {.name = "w", .param = pa, .grad = grad, .n = N};
    loom_param_seg sb = sa, sc = sa;
    sb.param = pb, sc.param = pc;
    loom_sgd_cfg cs = loom_sgd_cfg_default();
    cs.momentum = 0.9, cs.nesterov = true, cs.weight_decay = 1e-3;
    loom_adam_cfg ca = loom_adamw_cfg_default();
    loom_optim *a = NULL, *b = NULL, *c = NULL;
    if (kind == 0) {
      LT_OK(loom_optim_create_sgd(&sa, 1, &cs, &a));
      LT_OK(loom_optim_create_sgd(&sb, 1, &cs, &b));
      LT_OK(loom_optim_create_sgd(&sc, 1, &cs, &c));
    } else if (kind == 1) {
      LT_OK(loom_optim_create_adam(&sa, 1, &ca, &a));
      LT_OK(loom_optim_create_adam(&sb, 1, &ca, &b));
      LT_OK(loom_optim_create_adam(&sc, 1, &ca, &c));
    } else {
      LT_OK(loom_optim_create_adamw(&sa, 1, &ca, &a));
      LT_OK(loom_optim_create_adamw(&sb, 1, &ca, &b));
      LT_OK(loom_optim_create_adamw(&sc, 1, &ca, &c));
    }
    for (int t = 0; t < 7; t++) {
      memcpy(grad, g[t], sizeof grad);
      LT_OK(loom_optim_step(a));
      if (t < 3) LT_OK(loom_optim_step(b));
    }
    /* "save" b and "restore" into c */
    memcpy(pc, pb, sizeof pb);
    for (size_t i = 0; i < loom_optim_state_count(b); i++) {
      loom_optim_state from, to;
      LT_OK(loom_optim_state_at(b, i, &from));
      LT_OK(loom_optim_state_find(c, from.name, &to));
      memcpy(to.data, from.data, from.n * sizeof(float));
    }
    LT_OK(loom_optim_set_step_count(c, loom_optim_step_count(b)));
    for (int t = 3; t < 7; t++) {
      memcpy(grad, g[t], sizeof grad);
      LT_OK(loom_optim_step(c));
    }
    LT_TRUE(memcmp(pa, pc, sizeof pa) == 0);
    LT_EQ(loom_optim_step_count(c), 7);
    loom_optim_free(a), loom_optim_free(b), loom_optim_free(c);
  }
}

LT_TEST(config_validation_names_the_field) {
  loom_adam_cfg a = loom_adamw_cfg_default();
  LT_NEAR(a.lr, 1e-3, 0);
  LT_NEAR(a.beta1, 0.9, 0);
  LT_NEAR(a.beta2, 0.999, 0);
  LT_NEAR(a.eps, 1e-8, 0);
  LT_NEAR(a.weight_decay, 0.01, 0);
  LT_NEAR(loom_adam_cfg_default().weight_decay, 0, 0);
  LT_OK(loom_adam_cfg_validate(&a));
  a.lr = -1;
  LT_ERR(loom_adam_cfg_validate(&a), LOOM_EINVAL, "lr = -1");
  a = loom_adamw_cfg_default(), a.beta1 = 1.0;
  LT_ERR(loom_adam_cfg_validate(&a), LOOM_EINVAL, "beta1 = 1 is outside [0, 1)");
  a = loom_adamw_cfg_default(), a.beta2 = -0.1;
  LT_ERR(loom_adam_cfg_validate(&a), LOOM_EINVAL, "beta2");
  a = loom_adamw_cfg_default(), a.eps = 0;
  LT_ERR(loom_adam_cfg_validate(&a), LOOM_EINVAL, "eps = 0");
  a = loom_adamw_cfg_default(), a.weight_decay = NAN;
  LT_ERR(loom_adam_cfg_validate(&a), LOOM_EINVAL, "weight_decay");
  a = loom_adamw_cfg_default(), a.state_pool = (loom_pool)7;
  LT_ERR(loom_adam_cfg_validate(&a), LOOM_EINVAL, "state_pool 7");
  LT_ERR(loom_adam_cfg_validate(NULL), LOOM_EINVAL, "NULL");
  loom_optim *o = (loom_optim *)1;
  a = loom_adamw_cfg_default(), a.beta1 = 2;
  LT_ERR(loom_optim_create_adamw(NULL, 0, &a, &o), LOOM_EINVAL, "beta1");
  LT_TRUE(o == NULL);

  loom_sgd_cfg s = loom_sgd_cfg_default();
  LT_OK(loom_sgd_cfg_validate(&s));
  s.momentum = -0.5;
  LT_ERR(loom_sgd_cfg_validate(&s), LOOM_EINVAL, "momentum = -0.5");
  s = loom_sgd_cfg_default(), s.nesterov = true;
  LT_ERR(loom_sgd_cfg_validate(&s), LOOM_EINVAL, "nesterov needs momentum > 0");
  s.momentum = 0.9, s.dampening = 0.1;
  LT_ERR(loom_sgd_cfg_validate(&s), LOOM_EINVAL, "dampening = 0");
  s = loom_sgd_cfg_default(), s.lr = INFINITY;
  LT_ERR(loom_sgd_cfg_validate(&s), LOOM_EINVAL, "lr = inf");
  s = loom_sgd_cfg_default(), s.weight_decay = -1;
  LT_ERR(loom_sgd_cfg_validate(&s), LOOM_EINVAL, "weight_decay = -1");
}

LT_TEST(create_and_call_errors) {
  float p[2], g[2];
  loom_adam_cfg c = loom_adam_cfg_default();
  loom_optim *o = NULL;
  loom_param_seg bad = {.param = p, .grad = NULL, .n = 2};
  LT_ERR(loom_optim_create_adam(&bad, 1, &c, &o), LOOM_EINVAL, "segment 0 has n = 2 but a NULL grad");
  loom_param_seg dup[2] = {{.name = "x", .param = p, .grad = g, .n = 1},
                           {.name = "x", .param = p + 1, .grad = g + 1, .n = 1}};
  LT_ERR(loom_optim_create_adam(dup, 2, &c, &o), LOOM_EINVAL, "both named \"x\"");
  LT_ERR(loom_optim_create_adam(NULL, 3, &c, &o), LOOM_EINVAL, "segs is NULL");
  LT_ERR(loom_optim_create_adam(dup, 1, &c, NULL), LOOM_EINVAL, "out is NULL");
  LT_OK(loom_optim_create_adam(dup, 1, &c, &o));
  LT_ERR(loom_optim_set_lr(o, -0.1), LOOM_EINVAL, "lr = -0.1");
  LT_OK(loom_optim_set_lr(o, 0.5));
  LT_NEAR(loom_optim_lr(o), 0.5, 0);
  LT_ERR(loom_optim_set_step_count(o, -2), LOOM_EINVAL, "step -2 is negative");
  LT_ERR(loom_optim_rebind(o, 1, p, g), LOOM_EINVAL, "segment 1 out of range");
  LT_ERR(loom_optim_rebind(o, 0, p, NULL), LOOM_EINVAL, "NULL grad buffer");
  LT_OK(loom_optim_rebind(o, 0, p + 1, g + 1));
  LT_ERR(loom_optim_step(NULL), LOOM_EINVAL, "optimizer is NULL");
  loom_optim_free(o);
  loom_optim_free(NULL);
  /* an empty optimizer steps fine */
  LT_OK(loom_optim_create_sgd(NULL, 0, &(loom_sgd_cfg){.lr = 0.1}, &o));
  LT_OK(loom_optim_step(o));
  loom_optim_free(o);
}

LT_TEST(lr_schedules) {
  loom_lr_schedule s = loom_lr_schedule_default();
  LT_OK(loom_lr_schedule_validate(&s));
  LT_NEAR(loom_lr_at(&s, 0), 1e-3, 0);
  LT_NEAR(loom_lr_at(&s, 1000000), 1e-3, 0);
  s.kind = LOOM_LR_WARMUP, s.lr = 0.4, s.warmup_steps = 4;
  LT_NEAR(loom_lr_at(&s, 0), 0.1, 1e-15);
  LT_NEAR(loom_lr_at(&s, 1), 0.2, 1e-15);
  LT_NEAR(loom_lr_at(&s, 3), 0.4, 1e-15);
  LT_NEAR(loom_lr_at(&s, 50), 0.4, 0);
  LT_NEAR(loom_lr_at(&s, -5), 0.1, 1e-15);
  s.kind = LOOM_LR_COSINE, s.min_lr = 0.04, s.total_steps = 14;
  LT_OK(loom_lr_schedule_validate(&s));
  LT_NEAR(loom_lr_at(&s, 2), 0.3, 1e-15);   /* still warming up */
  LT_NEAR(loom_lr_at(&s, 4), 0.4, 1e-15);   /* p = 0: peak */
  LT_NEAR(loom_lr_at(&s, 9), 0.22, 1e-15);  /* p = 0.5: midpoint */
  LT_NEAR(loom_lr_at(&s, 14), 0.04, 0);     /* the floor from total on */
  LT_NEAR(loom_lr_at(&s, 99), 0.04, 0);
  double prev = 1;
  for (int t = 4; t <= 14; t++) {
    LT_TRUE(loom_lr_at(&s, t) <= prev);
    prev = loom_lr_at(&s, t);
  }
  s.total_steps = 4;
  LT_ERR(loom_lr_schedule_validate(&s), LOOM_EINVAL, "total_steps = 4 must exceed warmup_steps");
  s.total_steps = 14, s.min_lr = 0.5;
  LT_ERR(loom_lr_schedule_validate(&s), LOOM_EINVAL, "min_lr = 0.5");
  s.min_lr = 0, s.warmup_steps = -1;
  LT_ERR(loom_lr_schedule_validate(&s), LOOM_EINVAL, "warmup_steps = -1");
  s.warmup_steps = 0, s.kind = (loom_lr_kind)9;
  LT_ERR(loom_lr_schedule_validate(&s), LOOM_EINVAL, "kind 9");
}

/* bf16 parameters with f32 masters: updates smaller than a bf16 ulp still accumulate. */
LT_TEST(master_weights_accumulate_small_updates) {
  uint16_t w[3];
  float init[3] = {1.0f, -2.0f, 0.5f};
  loom_cvt_f32_to_bf16(init, w, 3);
  loom_master *m = NULL;
  LT_OK(loom_master_create(LOOM_BF16, w, 3, LOOM_POOL_COMPUTE, &m));
  LT_EQ(loom_master_numel(m), 3);
  loom_param_seg seg = loom_master_segment(m, "w");
  loom_sgd_cfg c = loom_sgd_cfg_default();
  c.lr = 1.0;
  loom_optim *o = NULL;
  LT_OK(loom_optim_create_sgd(&seg, 1, &c, &o));
  uint16_t gw[3];
  float gf[3] = {-1.0f / 1024, 0, 0}; /* 1/1024: below half a bf16 ulp of 1.0 (ulp 1/128) */
  loom_cvt_f32_to_bf16(gf, gw, 3);
  for (int t = 0; t < 8; t++) {
    if (t == 1) LT_EQ_HEX(w[0], 0x3f80); /* bf16 alone would never move */
    LT_OK(loom_master_load_grads(m, gw));
    LT_OK(loom_optim_step(o));
    LT_OK(loom_master_sync(m));
  }
  LT_NEAR(loom_master_params(m)[0], 1.0 + 8.0 / 1024, 0);
  LT_EQ_HEX(w[0], loom_f32_to_bf16(1.0f + 8.0f / 1024)); /* 1 + 1/128: now one ulp up */
  LT_EQ_HEX(w[0], 0x3f81);
  LT_EQ_HEX(w[1], loom_f32_to_bf16(-2.0f));
  loom_optim_free(o);
  loom_master_free(m);
  float f[2];
  LT_ERR(loom_master_create(LOOM_F32, f, 2, LOOM_POOL_COMPUTE, &m), LOOM_EDTYPE, "not bf16 or f16");
  LT_TRUE(m == NULL);
  LT_ERR(loom_master_create(LOOM_F16, NULL, 2, LOOM_POOL_COMPUTE, &m), LOOM_EINVAL, "NULL");
}

static size_t pool_bytes(void) {
  size_t sum = 0;
  for (int p = 0; p < LOOM_POOL_COUNT; p++) {
    loom_pool_stats s;
    loom_mem_stats((loom_pool)p, &s);
    sum += s.current_bytes;
  }
  return sum;
}

LT_TEST(create_paths_survive_oom) {
  static float p[40], g[40];
  uint16_t w[8] = {0};
  loom_param_seg segs[3] = {{.name = "a", .param = p, .grad = g, .n = 10},
                            {.param = p + 10, .grad = g + 10, .n = 20},
                            {.name = "c", .param = p + 30, .grad = g + 30, .n = 10}};
  for (int which = 0; which < 3; which++) {
    int failures = 0;
    for (uint64_t n = 1; n < 100; n++) {
      size_t before = pool_bytes();
      loom_alloc_fail_nth(n);
      int rc;
      if (which == 0) {
        loom_optim *o = NULL;
        loom_adam_cfg c = loom_adamw_cfg_default();
        rc = loom_optim_create_adamw(segs, 3, &c, &o);
        if (rc) LT_TRUE(o == NULL);
        loom_optim_free(o);
      } else if (which == 1) {
        loom_optim *o = NULL;
        loom_sgd_cfg c = loom_sgd_cfg_default();
        c.momentum = 0.9;
        rc = loom_optim_create_sgd(segs, 3, &c, &o);
        loom_optim_free(o);
      } else {
        loom_master *m = NULL;
        rc = loom_master_create(LOOM_F16, w, 8, LOOM_POOL_HOST, &m);
        if (rc) LT_TRUE(m == NULL);
        loom_master_free(m);
      }
      loom_alloc_fail_nth(0);
      LT_EQ(pool_bytes(), before);
      if (rc == LOOM_OK) break;
      LT_EQ(rc, LOOM_ENOMEM);
      failures++;
    }
    LT_TRUE(failures >= 3);
  }
}
