/* test_gpt.c: the GPT-2 model (loom/gpt.h): PyTorch's names, shapes and order, the parameter
 * count (GPT-2 small's 124,439,808 built under a dry run), GPT-2's initialiser, causality, the
 * loss at initialisation (ln V), a finite-difference gradient check, AdamW driving the loss down
 * on a repeated text, bf16 and f16 autocast against f32, bad configurations and inputs, and
 * allocation failures. */
#include "lt.h"
#include "lt_gpt.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

static loom_gpt_cfg small_cfg(void) {
  loom_gpt_cfg c = {.vocab = 11, .context = 8, .layers = 2, .heads = 2, .dim = 16};
  return c;
}

static float *pdata(loom_module *m, const char *name, size_t *n) {
  loom_param p;
  if (loom_module_param_by_name(m, name, &p)) return NULL;
  if (n) *n = p.numel;
  return loom_tensor_data(p.value);
}

static void moments(const float *p, size_t n, double *mean, double *sd) {
  double s = 0, s2 = 0;
  for (size_t i = 0; i < n; i++) s += p[i], s2 += (double)p[i] * p[i];
  *mean = s / (double)n;
  *sd = sqrt(s2 / (double)n - *mean * *mean);
}

LT_TEST(gpt_names_shapes_count_and_init) {
  loom_gpt_cfg c = small_cfg();
  loom_module *m = NULL;
  LT_OK(loom_nn_gpt_create(&c, 7, &m));
  LT_STREQ(loom_module_type(m), "GPT2");
  const int64_t V = 11, T = 8, C = 16;
  struct { const char *name; int64_t d0, d1; } want[] = {
      {"wte.weight", V, C},          {"wpe.weight", T, C},
      {"h.0.ln_1.weight", C, 0},     {"h.0.ln_1.bias", C, 0},
      {"h.0.attn.c_attn.weight", 3 * C, C}, {"h.0.attn.c_attn.bias", 3 * C, 0},
      {"h.0.attn.c_proj.weight", C, C},     {"h.0.attn.c_proj.bias", C, 0},
      {"h.0.ln_2.weight", C, 0},     {"h.0.ln_2.bias", C, 0},
      {"h.0.mlp.c_fc.weight", 4 * C, C},    {"h.0.mlp.c_fc.bias", 4 * C, 0},
      {"h.0.mlp.c_proj.weight", C, 4 * C},  {"h.0.mlp.c_proj.bias", C, 0},
  };
  const size_t per_block = 12, nw = sizeof want / sizeof *want;
  LT_EQ(loom_module_param_count(m), 2 + 2 * per_block + 2);
  for (size_t i = 0; i < loom_module_param_count(m); i++) {
    loom_param p;
    LT_OK(loom_module_param(m, i, &p));
    char name[64];
    size_t k = i < nw ? i : 2 + (i - 2) % per_block; /* block 1 repeats block 0 */
    if (i >= 2 + 2 * per_block) {
      LT_STREQ(p.name, i == 2 + 2 * per_block ? "ln_f.weight" : "ln_f.bias");
      LT_EQ(loom_tensor_ndim(p.value), 1);
      LT_EQ(loom_tensor_dim(p.value, 0), C);
      continue;
    }
    snprintf(name, sizeof name, "%s", want[k].name);
    if (i >= nw) name[2] = '1';
    LT_STREQ(p.name, name);
    LT_EQ(loom_tensor_ndim(p.value), want[k].d1 ? 2 : 1);
    LT_EQ(loom_tensor_dim(p.value, 0), want[k].d0);
    if (want[k].d1) LT_EQ(loom_tensor_dim(p.value, 1), want[k].d1);
    LT_EQ(loom_tensor_dtype(p.value), LOOM_F32);
  }
  size_t expect = (size_t)(V * C + T * C + 2 * (12 * C * C + 13 * C) + 2 * C);
  LT_EQ(loom_module_numel(m), expect);
  LT_EQ(loom_gpt_numel(&c), expect);
  LT_EQ(loom_module_numel(m), 6896);
  /* GPT-2's initialiser: N(0, 0.02), c_proj N(0, 0.02 / sqrt(2 layers)), biases 0, LN 1 */
  double mean, sd;
  size_t n = 0;
  float *p = pdata(m, "h.1.mlp.c_fc.weight", &n);
  moments(p, n, &mean, &sd);
  LT_NEAR(mean, 0, 0.003);
  LT_NEAR(sd, 0.02, 0.002);
  p = pdata(m, "h.0.mlp.c_proj.weight", &n);
  moments(p, n, &mean, &sd);
  LT_NEAR(sd, 0.01, 0.001);
  p = pdata(m, "wte.weight", &n);
  moments(p, n, &mean, &sd);
  LT_NEAR(sd, 0.02, 0.004);
  const char *ones[] = {"h.0.ln_1.weight", "h.1.ln_2.weight", "ln_f.weight"};
  const char *zeros[] = {"h.0.ln_1.bias", "h.1.attn.c_attn.bias", "h.0.mlp.c_proj.bias",
                         "ln_f.bias"};
  for (int k = 0; k < 3; k++) {
    p = pdata(m, ones[k], &n);
    for (size_t i = 0; i < n; i++) LT_EQ(p[i], 1);
  }
  for (int k = 0; k < 4; k++) {
    p = pdata(m, zeros[k], &n);
    for (size_t i = 0; i < n; i++) LT_EQ(p[i], 0);
  }
  /* no separate head: wte is the only [V, C] parameter; same seed same values, not another */
  loom_param none;
  LT_ERR(loom_module_param_by_name(m, "lm_head.weight", &none), LOOM_ENOTFOUND, "lm_head");
  loom_module *m2 = NULL, *m3 = NULL;
  LT_OK(loom_nn_gpt_create(&c, 7, &m2));
  LT_OK(loom_nn_gpt_create(&c, 8, &m3));
  loom_tensor *a1 = NULL, *a2 = NULL, *a3 = NULL;
  size_t na = 0;
  LT_OK(loom_module_arena(m, LOOM_F32, &a1, NULL, &na));
  LT_OK(loom_module_arena(m2, LOOM_F32, &a2, NULL, NULL));
  LT_OK(loom_module_arena(m3, LOOM_F32, &a3, NULL, NULL));
  LT_TRUE(!memcmp(loom_tensor_data(a1), loom_tensor_data(a2), na * sizeof(float)));
  LT_TRUE(memcmp(loom_tensor_data(a1), loom_tensor_data(a3), na * sizeof(float)) != 0);
  loom_module_free(m);
  loom_module_free(m2);
  loom_module_free(m3);
}

LT_TEST(gpt2_small_124m_count_under_dry_run) {
  loom_gpt_cfg c = loom_gpt_cfg_default();
  LT_EQ(c.vocab, 50257);
  LT_EQ(c.context, 1024);
  LT_EQ(c.layers, 12);
  LT_EQ(c.heads, 12);
  LT_EQ(c.dim, 768);
  LT_EQ(loom_gpt_numel(&c), 124439808);
  loom_mem_set_dry_run(true); /* every allocation made, no memory behind it, no values */
  loom_pool_stats before, after;
  loom_mem_reset_peak(LOOM_POOL_COMPUTE);
  loom_mem_stats(LOOM_POOL_COMPUTE, &before);
  loom_module *m = NULL;
  int rc = loom_nn_gpt_create(&c, 1, &m);
  size_t numel = m ? loom_module_numel(m) : 0, count = m ? loom_module_param_count(m) : 0;
  loom_param last = {0};
  char last_name[32] = "";
  if (m) rc = loom_module_param(m, count - 1, &last);
  if (!rc) snprintf(last_name, sizeof last_name, "%s", last.name); /* borrowed from m */
  /* a training step plans too (loom plan's way): forward, loss, backward of [1, 64] tokens */
  loom_tensor *x = NULL, *logits = NULL, *loss = NULL;
  int64_t shape[2] = {1, 64};
  if (!rc) rc = loom_tensor_zeros(LOOM_I64, 2, shape, &x);
  if (!rc) rc = loom_module_forward(m, x, &logits);
  if (!rc) rc = loom_gpt_loss(logits, x, &loss);
  if (!rc) rc = loom_backward(loss, NULL, false);
  loom_mem_stats(LOOM_POOL_COMPUTE, &after);
  loom_tensor_free(x);
  loom_tensor_free(logits);
  loom_tensor_free(loss);
  loom_module_free(m);
  loom_mem_set_dry_run(false);
  LT_OK(rc);
  /* values and gradients (2 x 4 bytes a parameter) and at least the logits and their gradient */
  LT_TRUE(after.peak_bytes - before.current_bytes >= 124439808u * 8 + 2 * 64 * 50257 * 4);
  LT_EQ(numel, 124439808);
  LT_EQ(count, 2 + 12 * 12 + 2);
  LT_STREQ(last_name, "ln_f.bias");
}

/* Random token indices [B, T] in [0, V), as dtype dt. */
static loom_tensor *tokens(int64_t B, int64_t T, int64_t V, loom_dtype dt, uint64_t seed) {
  int64_t shape[2] = {B, T};
  loom_tensor *x = NULL;
  if (loom_tensor_empty(dt, 2, shape, &x)) return NULL;
  for (int64_t i = 0; i < B * T; i++) {
    int64_t v = (int64_t)(loom_rng_hash(seed, (uint64_t)i) % (uint64_t)V);
    if (dt == LOOM_I64) ((int64_t *)loom_tensor_data(x))[i] = v;
    else ((int32_t *)loom_tensor_data(x))[i] = (int32_t)v;
  }
  return x;
}

LT_TEST(gpt_forward_causal_loss_at_init_and_bad_inputs) {
  loom_gpt_cfg c = {.vocab = 50, .context = 16, .layers = 2, .heads = 4, .dim = 32};
  loom_module *m = NULL;
  LT_OK(loom_nn_gpt_create(&c, 3, &m));
  const int64_t B = 3, T = 16, V = 50;
  loom_tensor *x = tokens(B, T, V, LOOM_I64, 1), *x32 = tokens(B, T, V, LOOM_I32, 1);
  loom_tensor *y = tokens(B, T, V, LOOM_I64, 2), *logits = NULL, *logits32 = NULL, *loss = NULL;
  LT_TRUE(x && x32 && y);
  LT_OK(loom_module_forward(m, x, &logits));
  LT_EQ(loom_tensor_ndim(logits), 3);
  LT_EQ(loom_tensor_dim(logits, 0), B);
  LT_EQ(loom_tensor_dim(logits, 1), T);
  LT_EQ(loom_tensor_dim(logits, 2), V);
  LT_OK(loom_module_forward(m, x32, &logits32)); /* i32 indices: the same logits */
  const float *l64 = loom_tensor_data(logits), *l32 = loom_tensor_data(logits32);
  LT_TRUE(!memcmp(l64, l32, (size_t)(B * T * V) * sizeof(float)));
  /* at initialisation the logits are small (std 0.02 sqrt(C) ~ 0.11): the loss is ln V plus
   * about half their variance (0.006) */
  double lv = 0;
  LT_OK(loom_gpt_loss(logits, y, &loss));
  LT_OK(loom_tensor_item(loss, &lv));
  LT_NEAR(lv, log((double)V), 0.05);
  /* causal: changing the last token of each row changes no logit before it */
  int64_t *xd = loom_tensor_data(x);
  for (int64_t b = 0; b < B; b++) xd[b * T + T - 1] = (xd[b * T + T - 1] + 1) % V;
  loom_tensor *logits2 = NULL;
  LT_OK(loom_module_forward(m, x, &logits2));
  const float *l2 = loom_tensor_data(logits2);
  double before = 0, last = 0;
  for (int64_t b = 0; b < B; b++)
    for (int64_t t = 0; t < T; t++)
      for (int64_t v = 0; v < V; v++) {
        size_t i = (size_t)((b * T + t) * V + v);
        double d = fabs((double)l2[i] - (double)l64[i]);
        if (t < T - 1) before = fmax(before, d);
        else last = fmax(last, d);
      }
  LT_NEAR(before, 0, 1e-6);
  LT_TRUE(last > 1e-4); /* the last position sees its own token */
  /* a shorter sequence is a prefix of the longer one's logits (positions 0..4) */
  loom_tensor *x5 = NULL, *logits5 = NULL;
  LT_OK(loom_tensor_slice(x, 1, 0, 5, 1, &x5));
  LT_OK(loom_module_forward(m, x5, &logits5));
  LT_EQ(loom_tensor_dim(logits5, 1), 5);
  double d5 = 0;
  for (int64_t b = 0; b < B; b++)
    for (int64_t i = 0; i < 5 * V; i++)
      d5 = fmax(d5, fabs((double)((float *)loom_tensor_data(logits5))[b * 5 * V + i] -
                         (double)l64[b * T * V + i]));
  LT_NEAR(d5, 0, 1e-5);
  /* bad inputs */
  loom_tensor *bad = NULL, *out = NULL;
  LT_OK(loom_tensor_zeros(LOOM_F32, 2, (int64_t[]){2, 4}, &bad));
  LT_ERR(loom_module_forward(m, bad, &out), LOOM_EDTYPE, "i32 or i64, not f32");
  loom_tensor_free(bad);
  LT_OK(loom_tensor_zeros(LOOM_I64, 2, (int64_t[]){2, 17}, &bad));
  LT_ERR(loom_module_forward(m, bad, &out), LOOM_ESHAPE, "1..16 (the context)");
  loom_tensor_free(bad);
  LT_OK(loom_tensor_zeros(LOOM_I64, 1, (int64_t[]){4}, &bad));
  LT_ERR(loom_module_forward(m, bad, &out), LOOM_ESHAPE, "[B, T]");
  loom_tensor_free(bad);
  LT_OK(loom_tensor_zeros(LOOM_I64, 2, (int64_t[]){1, 4}, &bad));
  ((int64_t *)loom_tensor_data(bad))[2] = 50; /* == vocab */
  LT_ERR(loom_module_forward(m, bad, &out), LOOM_EINVAL, "index 50 at position 2 is outside");
  LT_TRUE(out == NULL);
  LT_ERR(loom_gpt_loss(logits, x5, &out), LOOM_ESHAPE, "[B, T, V]");
  loom_tensor *ts[] = {x, x32, y, logits, logits32, loss, logits2, x5, logits5, bad};
  for (size_t i = 0; i < sizeof ts / sizeof *ts; i++) loom_tensor_free(ts[i]);
  loom_module_free(m);
}

/* The loss of a fixed batch, without gradients. */
static double loss_of(loom_module *m, int64_t rows, int64_t t) {
  double v = NAN;
  loom_tensor *x = NULL, *y = NULL, *logits = NULL, *l = NULL;
  loom_no_grad_enter();
  int rc = lt_gpt_batch(0, rows, t, &x, &y);
  if (!rc) rc = loom_module_forward(m, x, &logits);
  if (!rc) rc = loom_gpt_loss(logits, y, &l);
  if (!rc) rc = loom_tensor_item(l, &v);
  loom_no_grad_exit();
  loom_tensor_free(x);
  loom_tensor_free(y);
  loom_tensor_free(logits);
  loom_tensor_free(l);
  return rc ? NAN : v;
}

/* A model of cfg from seed with N(0, noise) added to every weight (0: none), and its arenas. */
static loom_module *model_with_arena(loom_gpt_cfg c, uint64_t seed, double noise,
                                     loom_tensor **values, loom_tensor **grads, size_t *numel) {
  loom_module *m = NULL;
  LT_OK(loom_nn_gpt_create(&c, seed, &m));
  LT_OK(loom_module_arena(m, LOOM_F32, values, grads, numel));
  float *w = loom_tensor_data(*values);
  loom_rng r;
  loom_rng_seed(&r, seed + 1000);
  for (size_t i = 0; i < *numel && noise; i++) w[i] += (float)(noise * loom_rng_normal(&r));
  return m;
}

/* Finite differences, in f32, on a tiny model whose weights are moved off their initial values
 * (N(0, 0.02) weights make a nearly linear model; N(0, 0.3) added makes every part of it,
 * softmax and GELU included, matter). Central differences with h = 1e-2: the loss (~5.5) is an
 * f32 with an ulp of 4.8e-7, so rounding alone moves (up - down) / 2h by up to ~5e-5; the
 * truncation error h^2 f''' / 6 is relative, ~1e-4 of the gradient here (measured: at most
 * 1.4e-4 absolute on gradients up to 0.47). Checked: |numeric - analytic| <= 1e-4 +
 * 2e-3 |analytic| for three elements of every parameter (first, middle, last); the gradients
 * checked are mostly 1e-2 .. 0.5, so a wrong rule (a missing term, a transposed weight) fails. */
LT_TEST(gpt_gradient_matches_finite_differences) {
  loom_gpt_cfg c = {.vocab = 256, .context = 6, .layers = 2, .heads = 2, .dim = 8};
  loom_tensor *arena = NULL, *grads = NULL;
  size_t na = 0;
  loom_module *m = model_with_arena(c, 5, 0.3, &arena, &grads, &na);
  const int64_t rows = 2, t = 6;
  LT_OK(loom_module_zero_grad(m));
  LT_OK(lt_gpt_backward(m, 0, rows, t, LOOM_AUTOCAST_OFF, 1.0f, NULL));
  for (size_t k = 0; k < loom_module_param_count(m); k++) {
    loom_param p;
    LT_OK(loom_module_param(m, k, &p));
    float *v = loom_tensor_data(p.value);
    const float *g = loom_tensor_data(p.grad);
    size_t at[3] = {0, p.numel / 2, p.numel - 1};
    for (int j = 0; j < 3; j++) {
      const double h = 1e-2;
      float keep = v[at[j]];
      v[at[j]] = keep + (float)h;
      double up = loss_of(m, rows, t);
      v[at[j]] = keep - (float)h;
      double down = loss_of(m, rows, t);
      v[at[j]] = keep;
      double fd = (up - down) / (2 * h), an = g[at[j]];
      if (!(fabs(fd - an) <= 1e-4 + 2e-3 * fabs(an)))
        lt_fail_at(__FILE__, __LINE__, "%s[%zu]: finite difference %.6g, backward %.6g", p.name,
                   at[j], fd, an);
    }
  }
  loom_module_free(m);
}

/* A repeated text of 86 bytes (vocabulary 256): AdamW at 3e-3 for 100 steps on 8 windows of 16
 * bytes (4 batches in turn) takes the loss from ln 256 = 5.55 to under 1 (0.71 measured). */
LT_TEST(gpt_adamw_loss_falls_on_repeated_text) {
  loom_gpt_cfg c = {.vocab = 256, .context = 16, .layers = 2, .heads = 2, .dim = 32};
  loom_tensor *values = NULL, *grads = NULL;
  size_t numel = 0;
  loom_module *m = model_with_arena(c, 11, 0, &values, &grads, &numel);
  loom_param_seg seg = {"gpt", loom_tensor_data(values), loom_tensor_data(grads), numel, 0};
  loom_adam_cfg ac = loom_adamw_cfg_default();
  ac.lr = 3e-3;
  loom_optim *opt = NULL;
  LT_OK(loom_optim_create_adamw(&seg, 1, &ac, &opt));
  double first = 0, last = 0;
  for (int s = 0; s < 100; s++) {
    LT_OK(loom_module_zero_grad(m));
    LT_OK(lt_gpt_backward(m, (int64_t)(s % 4) * 8, 8, 16, LOOM_AUTOCAST_OFF, 1.0f, &last));
    if (s == 0) first = last;
    LT_OK(loom_optim_step(opt));
  }
  LT_NEAR(first, log(256.0), 0.1);
  if (!(last < 1.0)) lt_fail_at(__FILE__, __LINE__, "loss %g -> %g after 100 steps", first, last);
  loom_optim_free(opt);
  loom_module_free(m);
}

/* bf16 and f16 autocast (matmuls and linears in the low dtype; layer norm, softmax and the loss
 * in f32, as PyTorch's lists) against f32 on the same weights. bf16 keeps 8 significant bits
 * (relative rounding 2^-9 = 0.2%; f16 11 bits, 2^-12), and the roundings are independent, so
 * over a mean of 64 positions they largely cancel: measured in bf16, the loss differs by 3e-5
 * relative and the gradients by 0.2% of the largest element. Bounds, for both: the loss within
 * 1e-3 relative, each gradient element within 1% of the largest. */
LT_TEST(gpt_bf16_and_f16_autocast_close_to_f32) {
  loom_gpt_cfg c = {.vocab = 256, .context = 16, .layers = 2, .heads = 2, .dim = 32};
  loom_tensor *values = NULL, *grads = NULL;
  size_t numel = 0;
  loom_module *m = model_with_arena(c, 13, 0.05, &values, &grads, &numel); /* not tiny */
  float *g32 = calloc(numel, sizeof(float));
  double l32 = 0;
  LT_OK(loom_module_zero_grad(m));
  LT_OK(lt_gpt_backward(m, 0, 4, 16, LOOM_AUTOCAST_OFF, 1.0f, &l32));
  memcpy(g32, loom_tensor_data(grads), numel * sizeof(float));
  const loom_autocast_mode modes[2] = {LOOM_AUTOCAST_BF16, LOOM_AUTOCAST_F16};
  for (int k = 0; k < 2; k++) {
    double low = 0;
    LT_OK(loom_module_zero_grad(m));
    LT_OK(lt_gpt_backward(m, 0, 4, 16, modes[k], 1.0f, &low));
    const float *g = loom_tensor_data(grads);
    double gmax = 0, gdiff = 0;
    for (size_t i = 0; i < numel; i++) {
      gmax = fmax(gmax, fabs(g32[i]));
      gdiff = fmax(gdiff, fabs((double)g[i] - g32[i]));
    }
    LT_NEAR(low, l32, 1e-3 * l32);
    LT_TRUE(low != l32); /* the low dtype really ran */
    if (!(gdiff <= 0.01 * gmax))
      lt_fail_at(__FILE__, __LINE__, "gradients: %s differs by %g, largest %g",
                 k ? "f16" : "bf16", gdiff, gmax);
  }
  free(g32);
  loom_module_free(m);
}

/* GPT-2's forward as HF transformers computes it (Conv1D layout), in Python doubles, from
 * weights given by a formula: tests/nn/gpt_ref.py printed these values. loom computes in f32
 * (relative rounding 6e-8 per operation, a few hundred operations deep): the logits agree to
 * 1e-5 and the loss to 1e-6 (measured: a few 1e-7). */
/* tests/nn/gpt_ref.py: V 11, T 5, 2 layers, 2 heads, C 8 */
static const double gpt_ref_loss = 2.47081736082;
static const float gpt_ref_logits[110] = {
    -0.382309314f, 0.856559347f, 0.316105779f, 0.876066254f, -0.810178427f, 0.387619618f,
    0.041602166f, 0.818094168f, -1.26043754f, -0.998347908f, -0.888590984f, -0.473605933f,
    1.03180871f, 0.476190109f, 0.885560084f, -0.858387691f, 0.554839239f, 0.326958681f,
    0.540602934f, -0.865598966f, -1.21346691f, -0.929256983f, -0.478548132f, 1.12869076f,
    0.5224673f, 0.902510872f, -0.814288746f, 0.720840408f, 0.532943605f, 0.50887446f,
    -0.764183333f, -1.12159917f, -0.752523449f, -0.599344857f, 0.936459728f, 0.309707408f,
    0.854865321f, -1.07486381f, 0.777556116f, 0.358132364f, -0.0365379638f, -0.476304488f,
    -0.998821967f, -0.750372568f, -0.917519208f, 1.0224305f, 0.67756882f, 0.0379815152f,
    -0.462213475f, 0.438279956f, 0.281600564f, -0.4978872f, 0.272988685f, -0.841244383f,
    -0.415437565f, 0.101246972f, 0.210010808f, 0.398059805f, -0.226331259f, 0.672660271f,
    -0.0271901725f, 0.408255608f, 0.117555713f, 0.240120794f, 0.928790409f, 0.541888676f,
    -0.313260538f, 1.03473697f, 0.655287914f, 0.772420507f, -0.507437011f, 0.275556929f,
    0.341652448f, 0.845303027f, -0.839589939f, -1.10778311f, -0.703984201f, -0.304074089f,
    0.985085778f, 0.959575449f, 0.328817316f, -0.0640529434f, -0.195578606f, 0.241546585f,
    0.430077533f, -0.00697379121f, -0.602324705f, 0.0122732182f, -0.648494736f, 0.75578754f,
    0.349213535f, 0.258327238f, -0.573646144f, 0.852218992f, 0.652677781f, -0.896919048f,
    0.672365969f, -0.132628749f, 0.159407671f, -0.262932517f, 0.595555599f, 0.429216445f,
    0.730672379f, -0.725861761f, -0.326952891f, -0.383505071f, 0.679479632f, -0.787642336f,
    -1.13843604f, -0.701780912f,
};

LT_TEST(gpt_matches_reference_forward) {
  loom_gpt_cfg c = {.vocab = 11, .context = 5, .layers = 2, .heads = 2, .dim = 8};
  loom_module *m = NULL;
  LT_OK(loom_nn_gpt_create(&c, 1, &m));
  for (size_t k = 0; k < loom_module_param_count(m); k++) { /* gpt_ref.py's val(k, e) */
    loom_param p;
    LT_OK(loom_module_param(m, k, &p));
    bool ln_weight = strstr(p.name, "ln_") && strstr(p.name, ".weight");
    float *v = loom_tensor_data(p.value);
    for (size_t e = 0; e < p.numel; e++) {
      double de = (double)e;
      v[e] = (float)((ln_weight ? 1.0 : 0.0) + 0.3 * sin(0.5 + 0.37 * de + 0.013 * de * de +
                                                         1.3 * (double)k));
    }
  }
  const int64_t tok[10] = {3, 1, 4, 1, 5, 9, 2, 6, 5, 3}, tgt[10] = {1, 4, 1, 5, 9, 2, 6, 5, 3, 5};
  const int64_t shape[2] = {2, 5};
  loom_tensor *x = NULL, *y = NULL, *logits = NULL, *loss = NULL;
  LT_OK(loom_tensor_from_data(LOOM_I64, 2, shape, tok, &x));
  LT_OK(loom_tensor_from_data(LOOM_I64, 2, shape, tgt, &y));
  LT_OK(loom_module_forward(m, x, &logits));
  LT_OK(loom_gpt_loss(logits, y, &loss));
  const float *l = loom_tensor_data(logits);
  double worst = 0, lv = 0;
  for (int i = 0; i < 110; i++) worst = fmax(worst, fabs((double)l[i] - gpt_ref_logits[i]));
  LT_NEAR(worst, 0, 1e-5);
  LT_OK(loom_tensor_item(loss, &lv));
  LT_NEAR(lv, gpt_ref_loss, 1e-6);
  loom_tensor *ts[] = {x, y, logits, loss};
  for (int i = 0; i < 4; i++) loom_tensor_free(ts[i]);
  loom_module_free(m);
}

LT_TEST(gpt_bad_configs_refused_naming_the_field) {
  loom_module *m = (loom_module *)1;
  loom_gpt_cfg c = small_cfg();
  LT_OK(loom_gpt_cfg_validate(&c));
  struct { int64_t *field; int64_t value; const char *msg; } bad[] = {
      {&c.vocab, 0, "vocab is 0"},          {&c.context, -1, "context is -1"},
      {&c.layers, 0, "layers is 0"},        {&c.heads, 0, "heads is 0"},
      {&c.dim, 0, "dim is 0"},              {&c.heads, 3, "heads (3) must divide dim (16)"},
      {&c.heads, 32, "heads is 32"},        {&c.dim, (int64_t)1 << 21, "dim is 2097152"},
      {&c.vocab, (int64_t)1 << 40, "vocab is"},
  };
  for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
    c = small_cfg();
    *bad[i].field = bad[i].value;
    LT_ERR(loom_gpt_cfg_validate(&c), LOOM_EINVAL, bad[i].msg);
    LT_ERR(loom_nn_gpt_create(&c, 1, &m), LOOM_EINVAL, bad[i].msg);
    LT_TRUE(m == NULL);
    LT_EQ(loom_gpt_numel(&c), 0);
    m = (loom_module *)1;
  }
  LT_ERR(loom_gpt_cfg_validate(NULL), LOOM_EINVAL, "cfg is NULL");
  LT_ERR(loom_nn_gpt_create(NULL, 1, &m), LOOM_EINVAL, "cfg is NULL");
  c = small_cfg();
  LT_ERR(loom_nn_gpt_create(&c, 1, NULL), LOOM_EINVAL, "out is NULL");
  LT_EQ(loom_gpt_numel(NULL), 0);
}

/* Every allocation of a create failing in turn: an error, no leak, no crash. */
LT_TEST(gpt_create_out_of_memory_sweep) {
  loom_gpt_cfg c = {.vocab = 5, .context = 4, .layers = 2, .heads = 1, .dim = 4};
  loom_pool_stats before;
  loom_mem_stats(LOOM_POOL_COMPUTE, &before);
  for (uint64_t n = 1;; n++) {
    loom_module *m = NULL;
    loom_alloc_fail_nth(n);
    int rc = loom_nn_gpt_create(&c, 1, &m);
    loom_alloc_fail_nth(0);
    loom_module_free(m);
    loom_pool_stats now;
    loom_mem_stats(LOOM_POOL_COMPUTE, &now);
    LT_EQ(now.current_bytes, before.current_bytes);
    if (rc == LOOM_OK) break;
    LT_EQ(rc, LOOM_ENOMEM);
    LT_TRUE(m == NULL);
    LT_TRUE(n < 10000);
  }
}
