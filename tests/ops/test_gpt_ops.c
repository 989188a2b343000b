/* test_gpt_ops.c: the ops a GPT-2 model is made of, composed as the model will compose them
 * (PyTorch's GPT-2 layout: wte, wpe, h.i.ln_1, attn.c_attn, attn.c_proj, ln_2, mlp.c_fc,
 * mlp.c_proj, ln_f, lm_head tied to wte; pre-norm blocks, tanh GELU, causal attention), checked
 * by finite differences and in f16 / bf16 against f32 (gradcheck.h): the attention block
 * alone, a whole block, and a one-block model from token ids to the cross-entropy loss with
 * every parameter. Also the tanh GELU's values (GPT-2's gelu_new, not the erf form). */
#include "core/core_int.h" /* LOOM_TRY */
#include "gradcheck.h"

#include <math.h>

/* Temporaries of one composed forward, freed together. */
typedef struct bag {
  loom_tensor *t[96];
  int n;
} bag;

static loom_tensor **slot(bag *b) { return &b->t[b->n++]; }

static void bag_free(bag *b) {
  for (int i = 0; i < b->n; i++) loom_tensor_free(b->t[i]);
  b->n = 0;
}

/* The next `ndim`/`shape` parameter of a flat vector, a view from element *off on. */
static int param(bag *b, loom_tensor *flat, int64_t *off, int ndim, const int64_t *shape,
                 loom_tensor **out) {
  int64_t n = 1;
  for (int i = 0; i < ndim; i++) n *= shape[i];
  loom_tensor **s = slot(b), **v = slot(b);
  int rc = loom_slice(flat, 0, *off, *off + n, 1, s);
  if (!rc) rc = loom_reshape(*s, ndim, shape, v);
  *off += n;
  *out = *v;
  return rc;
}

/* attn(x) = c_proj(merge(sdpa(split(c_attn(x))))) for x [B, T, C]. */
static int attention(bag *b, loom_tensor *x, loom_tensor *wa, loom_tensor *ba, loom_tensor *wp,
                     loom_tensor *bp, int64_t H, loom_tensor **out) {
  int rc = LOOM_OK;
  int64_t B = loom_tensor_shape(x)[0], T = loom_tensor_shape(x)[1], C = loom_tensor_shape(x)[2];
  int64_t heads[4] = {B, T, H, C / H}, merged[3] = {B, T, C};
  loom_tensor **qkv = slot(b), *hd[3];
  LOOM_TRY(loom_linear(x, wa, ba, qkv));
  for (int i = 0; i < 3; i++) {
    loom_tensor **part = slot(b), **split = slot(b), **h = slot(b);
    LOOM_TRY(loom_slice(*qkv, -1, i * C, (i + 1) * C, 1, part));
    LOOM_TRY(loom_reshape(*part, 4, heads, split));
    LOOM_TRY(loom_transpose(*split, 1, 2, h));
    hd[i] = *h;
  }
  loom_tensor **y = slot(b), **yt = slot(b), **ym = slot(b);
  LOOM_TRY(loom_scaled_dot_product_attention(hd[0], hd[1], hd[2], true, y));
  LOOM_TRY(loom_transpose(*y, 1, 2, yt));
  LOOM_TRY(loom_reshape(*yt, 3, merged, ym));
  LOOM_TRY(loom_linear(*ym, wp, bp, out));
done:
  return rc;
}

/* One pre-norm block's parameters, in PyTorch's order, as shapes: ln_1.weight, ln_1.bias,
 * attn.c_attn.weight, .bias, attn.c_proj.weight, .bias, ln_2.weight, ln_2.bias, mlp.c_fc.weight,
 * .bias, mlp.c_proj.weight, .bias. */
enum { NPARAM = 12 };
typedef struct shape2 {
  int nd;
  int64_t s[2];
} shape2;

static void block_shapes(int64_t C, shape2 sh[NPARAM]) {
  const shape2 v[NPARAM] = {{1, {C}}, {1, {C}}, {2, {3 * C, C}}, {1, {3 * C}},
                            {2, {C, C}}, {1, {C}}, {1, {C}}, {1, {C}},
                            {2, {4 * C, C}}, {1, {4 * C}}, {2, {C, 4 * C}}, {1, {C}}};
  for (int i = 0; i < NPARAM; i++) sh[i] = v[i];
}

/* The length of a block's flat parameter vector. */
static int64_t block_params(int64_t C) {
  shape2 sh[NPARAM];
  block_shapes(C, sh);
  int64_t n = 0;
  for (int i = 0; i < NPARAM; i++) n += sh[i].s[0] * (sh[i].nd == 2 ? sh[i].s[1] : 1);
  return n;
}

/* x + attn(ln_1(x)), then + c_proj(gelu_tanh(c_fc(ln_2(.)))), the parameters views of the
 * flat vector p. */
static int block(bag *b, loom_tensor *x, loom_tensor *p, int64_t H, loom_tensor **out) {
  int rc = LOOM_OK;
  int64_t off = 0;
  shape2 sh[NPARAM];
  loom_tensor *w[NPARAM];
  block_shapes(loom_tensor_shape(x)[2], sh);
  for (int i = 0; i < NPARAM; i++) LOOM_TRY(param(b, p, &off, sh[i].nd, sh[i].s, &w[i]));
  loom_tensor **h1 = slot(b), **a = slot(b), **x1 = slot(b), **h2 = slot(b), **f = slot(b),
              **g = slot(b), **m = slot(b);
  LOOM_TRY(loom_layer_norm(x, 1, w[0], w[1], 1e-5, h1));
  LOOM_TRY(attention(b, *h1, w[2], w[3], w[4], w[5], H, a));
  LOOM_TRY(loom_add(x, *a, x1));
  LOOM_TRY(loom_layer_norm(*x1, 1, w[6], w[7], 1e-5, h2));
  LOOM_TRY(loom_linear(*h2, w[8], w[9], f));
  LOOM_TRY(loom_gelu(*f, LOOM_GELU_TANH, g));
  LOOM_TRY(loom_linear(*g, w[10], w[11], m));
  LOOM_TRY(loom_add(*x1, *m, out));
done:
  return rc;
}

enum { HEADS = 2 };

/* in: x [B, T, C], w_attn [3C, C], b_attn [3C], w_proj [C, C], b_proj [C] */
static int op_attention(loom_tensor **in, loom_tensor **out, void *ctx) {
  bag b = {0};
  int rc = attention(&b, in[0], in[1], in[2], in[3], in[4], HEADS, out);
  bag_free(&b);
  return rc;
}

/* in: x [B, T, C], the block's flat parameters */
static int op_block(loom_tensor **in, loom_tensor **out, void *ctx) {
  bag b = {0};
  int rc = block(&b, in[0], in[1], HEADS, out);
  bag_free(&b);
  return rc;
}

/* The model's data: token ids [B, T], positions [T], next-token labels [B * T]. */
typedef struct gpt_data {
  loom_tensor *idx, *pos, *labels;
} gpt_data;

/* in: wte [V, C], wpe [T, C], the block's flat parameters, ln_f (weight, bias) flat [2C]; out:
 * the mean cross entropy of lm_head(ln_f(block(wte[idx] + wpe[pos]))), lm_head = wte. */
static int op_model(loom_tensor **in, loom_tensor **out, void *ctx) {
  const gpt_data *d = ctx;
  bag b = {0};
  int rc = LOOM_OK;
  int64_t V = loom_tensor_shape(in[0])[0], C = loom_tensor_shape(in[0])[1], off = 0, c[1] = {C};
  int64_t rows[2] = {loom_tensor_numel(d->labels), V};
  loom_tensor **tok = slot(&b), **pos = slot(&b), **x = slot(&b), **h = slot(&b),
              **hf = slot(&b), **logits = slot(&b), **flat = slot(&b), *lw, *lb;
  LOOM_TRY(loom_embedding(in[0], d->idx, tok));
  LOOM_TRY(loom_embedding(in[1], d->pos, pos));
  LOOM_TRY(loom_add(*tok, *pos, x));
  LOOM_TRY(block(&b, *x, in[2], HEADS, h));
  LOOM_TRY(param(&b, in[3], &off, 1, c, &lw));
  LOOM_TRY(param(&b, in[3], &off, 1, c, &lb));
  LOOM_TRY(loom_layer_norm(*h, 1, lw, lb, 1e-5, hf));
  LOOM_TRY(loom_linear(*hf, in[0], NULL, logits)); /* tied: the same wte */
  LOOM_TRY(loom_reshape(*logits, 2, rows, flat));
  LOOM_TRY(loom_cross_entropy(*flat, d->labels, LOOM_REDUCTION_MEAN, -100, out));
done:
  bag_free(&b);
  return rc;
}

/* Normalising amplifies the inputs' rounding in f16 / bf16 (as grad_layer_norm's 5e-2). */
LT_TEST(grad_gpt_attention_block) {
  gc_opts o = {.lp_tol = 5e-2};
  gc_input in[] = {S(3, 2, 5, 6), S(2, 18, 6), S(1, 18), S(2, 6, 6), S(1, 6)};
  gc_run("gpt attention", op_attention, NULL, 5, in, &o);
}

LT_TEST(grad_gpt_block) {
  gc_opts o = {.lp_tol = 5e-2};
  gc_input in[] = {S(3, 2, 5, 8), S(1, block_params(8))};
  gc_run("gpt block", op_block, NULL, 2, in, &o);
}

LT_TEST(grad_gpt_model_to_loss) {
  enum { B = 2, T = 5, C = 8, V = 11 };
  int64_t sh[2] = {B, T}, t = T, n = B * T;
  int32_t ids[B * T], pos[T], next[B * T];
  for (int i = 0; i < B * T; i++) ids[i] = (7 * i + 3) % V;
  for (int i = 0; i < T; i++) pos[i] = i;
  for (int i = 0; i < B * T; i++) next[i] = i % T == T - 1 ? -100 : ids[i + 1]; /* last: ignored */
  gpt_data d = {0};
  LT_OK(loom_tensor_from_data(LOOM_I32, 2, sh, ids, &d.idx));
  LT_OK(loom_tensor_from_data(LOOM_I32, 1, &t, pos, &d.pos));
  LT_OK(loom_tensor_from_data(LOOM_I32, 1, &n, next, &d.labels));
  gc_opts o = {.lp_tol = 5e-2};
  gc_input in[] = {S(2, V, C), S(2, T, C), S(1, block_params(C)), S(1, 2 * C)};
  gc_run("gpt model", op_model, &d, 4, in, &o);
  loom_tensor_free(d.idx);
  loom_tensor_free(d.pos);
  loom_tensor_free(d.labels);
}

/* GPT-2's gelu_new: 0.5 x (1 + tanh(sqrt(2 / pi) (x + 0.044715 x^3))), in double here; it
 * differs from the erf form by up to ~5e-4 (PyTorch approximate="tanh" vs "none"). */
LT_TEST(gelu_tanh_values) {
  static const float xs[] = {-3.0f, -1.0f, -0.5f, 0.0f, 0.5f, 1.0f, 2.0f, 3.0f};
  int64_t n = 8;
  loom_tensor *x = NULL, *yt = NULL, *ye = NULL;
  LT_OK(loom_tensor_from_data(LOOM_F32, 1, &n, xs, &x));
  LT_OK(loom_gelu(x, LOOM_GELU_TANH, &yt));
  LT_OK(loom_gelu(x, LOOM_GELU_EXACT, &ye));
  const float *pt = loom_tensor_data(yt), *pe = loom_tensor_data(ye);
  double most = 0;
  for (int i = 0; i < n; i++) {
    double v = xs[i], want = 0.5 * v * (1 + tanh(sqrt(2 / M_PI) * (v + 0.044715 * v * v * v)));
    LT_NEAR(pt[i], want, 1e-6);
    LT_NEAR(pe[i], 0.5 * v * (1 + erf(v / sqrt(2.0))), 1e-6);
    most = fmax(most, fabs((double)pt[i] - pe[i]));
  }
  LT_TRUE(most > 1e-4); /* the two forms are told apart */
  loom_tensor_free(x);
  loom_tensor_free(yt);
  loom_tensor_free(ye);
}
